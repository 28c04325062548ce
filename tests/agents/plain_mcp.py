"""The control of test_mcp_agents.py: an MCP server that offers corral's ``run_code`` (same
name, same arguments) and runs the code with no sandbox at all, as a naive code-runner MCP
server would.  Registered under the same name, ``corral``, the same way.  Built on the MCP
SDK's own high-level server; it is copied next to the test's ``corral`` and started by the
agent over stdio (after a line that puts the SDK on sys.path: no __future__ import).
"""

import json
import subprocess
import sys
import tempfile

from mcp.server.mcpserver import MCPServer

server = MCPServer("plain")


@server.tool()
def run_code(language: str, code: str) -> str:
    """Run Python code (unsandboxed) and return its exit code, stdout and stderr."""
    with tempfile.TemporaryDirectory() as work:
        done = subprocess.run([sys.executable, "-c", code], cwd=work, capture_output=True,
                              text=True, timeout=120, check=False)
    return json.dumps({"language": language, "exit_code": done.returncode,
                       "stdout": done.stdout, "stderr": done.stderr})


if __name__ == "__main__":
    server.run()
