"""``corral mcp``: corral's sandbox as MCP tools, a workspace per MCP session.

:mod:`.tools` (the tools as data; arguments to requests, results to replies),
:mod:`.session` (the sessions' workspaces, every file operation through corral.fsops) and
:mod:`.server` (the official MCP SDK, an optional extra: ``pip install corral[mcp]``).
Nothing is imported here, so ``corral`` itself never needs the SDK.
"""
