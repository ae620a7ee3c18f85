"""Engine: run plans, moving data between connectors and operators as Arrow."""
