#!/usr/bin/env python3
"""An MCP server and client (the official `mcp` Python SDK, streamable HTTP) for latchkey's
MCP tool rules.

  mcp_tools.py --tls CERT KEY
      Serves MCP over streamable HTTP at https://127.0.0.1:PORT/mcp (SSE responses, or JSON
      when MCP_JSON_RESPONSE=1), with tools search_issues(repo, q), get_issue(repo, number)
      and delete_repository(repo).
      Prints "listening on 127.0.0.1:PORT", then {"event": "call", "tool", "args"} per tool
      actually run.
  mcp_tools.py client URL CA PROXY CALLS_JSON
      Connects through the HTTP proxy PROXY trusting only CA, initializes, lists the tools,
      then makes each call of the JSON list ([name, arguments]) in turn. Prints one JSON line:
      {"tools": [names listed], "results": [{"ok": text} | {"error": message}]}.
"""

import asyncio
import json
import os
import socket
import ssl
import sys

import httpx2
import uvicorn
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError


def event(**fields):
    print(json.dumps(fields), flush=True)


def serve(cert, key, json_response):
    server = MCPServer("latchkey-test")

    @server.tool()
    def search_issues(repo: str, q: str) -> str:
        event(event="call", tool="search_issues", args={"repo": repo, "q": q})
        return f"found 2 issues in {repo} for {q}"

    @server.tool()
    def get_issue(repo: str, number: int) -> str:
        event(event="call", tool="get_issue", args={"repo": repo, "number": number})
        return f"issue {repo}#{number}"

    @server.tool()
    def delete_repository(repo: str) -> str:
        event(event="call", tool="delete_repository", args={"repo": repo})
        return f"deleted {repo}"

    app = server.streamable_http_app(
        json_response=json_response,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        ssl_certfile=cert,
        ssl_keyfile=key,
        log_level="warning",
        lifespan="on",
    )
    print("listening on 127.0.0.1:%d" % port, flush=True)
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


async def client(url, ca, proxy, calls):
    ctx = ssl.create_default_context(cafile=ca)
    http = httpx2.AsyncClient(proxy=proxy, verify=ctx, timeout=httpx2.Timeout(20.0))
    out = {"tools": [], "results": []}
    async with http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                listed = await session.list_tools()
                out["tools"] = sorted(t.name for t in listed.tools)
                for name, arguments in calls:
                    try:
                        result = await session.call_tool(name, arguments)
                        texts = [c.text for c in result.content if getattr(c, "text", None) is not None]
                        if result.is_error:
                            out["results"].append({"tool_error": " ".join(texts)})
                        else:
                            out["results"].append({"ok": " ".join(texts)})
                    except MCPError as e:
                        out["results"].append({"error": str(e)})
    print(json.dumps(out), flush=True)


def main():
    if sys.argv[1] == "--tls":
        serve(sys.argv[2], sys.argv[3], os.environ.get("MCP_JSON_RESPONSE") == "1")
    elif sys.argv[1] == "client":
        asyncio.run(client(sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5])))
    else:
        sys.exit("usage: mcp_tools.py --tls CERT KEY | client URL CA PROXY CALLS_JSON")


if __name__ == "__main__":
    main()
