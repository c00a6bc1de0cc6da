"""--mode=serve: a translation server with dynamic batching and a page (the [serve] extra)."""
