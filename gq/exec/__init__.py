"""Execution: one host process per device, the workers it keeps resident, their protocol."""
