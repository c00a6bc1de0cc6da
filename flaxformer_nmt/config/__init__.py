"""Configs: the table of sizes and the builders experiment files call, the choices a field may
take, `validate`, and loading a config file by name or path."""
