"""`memctl mcp`: the tools (plain functions over the library) and the protocol side (the MCP SDK).

May import everything but memctl.cli; only protocol.py imports the SDK.
"""
