"""What every stage runs on: text files written whole, JSON-line records, the devices and
processes of a job (pmap, collectives, multi-host start-up), and the accelerator check."""
