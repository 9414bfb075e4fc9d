#!/usr/bin/env python3
"""A real GraphQL server (graphql-core, the reference implementation's Python port) over plain
HTTP on loopback, for the policy tests of `graphql = { … }` predicates.

Usage: graphql_server.py PORT_FILE

Binds 127.0.0.1:0, writes the port to PORT_FILE, then serves GraphQL over HTTP at /graphql:
GET ?query=…&operationName=…, POST application/json (one request or a batch: a JSON array),
POST application/graphql. Every operation it executes is printed (flushed) as

    executed KIND NAME FIELDS

(KIND query/mutation, NAME or -, FIELDS the top-level fields, comma-separated), so a test can
assert what reached the server — a refused mutation never appears. Runs until killed.
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from graphql import (
    GraphQLArgument,
    GraphQLBoolean,
    GraphQLField,
    GraphQLInt,
    GraphQLList,
    GraphQLNonNull,
    GraphQLObjectType,
    GraphQLSchema,
    GraphQLString,
    OperationDefinitionNode,
    graphql_sync,
    parse,
)

LOCK = threading.Lock()

Repository = GraphQLObjectType(
    "Repository",
    lambda: {
        "name": GraphQLField(GraphQLString, resolve=lambda r, _i: r["name"]),
        "owner": GraphQLField(User, resolve=lambda r, _i: {"login": "acme"}),
    },
)

User = GraphQLObjectType(
    "User",
    lambda: {
        "login": GraphQLField(GraphQLString, resolve=lambda u, _i: u["login"]),
        "repositories": GraphQLField(
            GraphQLList(Repository),
            args={"first": GraphQLArgument(GraphQLInt)},
            resolve=lambda _u, _i, first=2: [{"name": f"repo{n}"} for n in range(first)],
        ),
    },
)

Query = GraphQLObjectType(
    "Query",
    {"viewer": GraphQLField(User, resolve=lambda *_: {"login": "agent"})},
)

Mutation = GraphQLObjectType(
    "Mutation",
    {
        "deleteRepository": GraphQLField(
            GraphQLBoolean,
            args={"name": GraphQLArgument(GraphQLNonNull(GraphQLString))},
            resolve=lambda *_a, **_k: True,
        ),
        "createIssue": GraphQLField(
            GraphQLString,
            args={"title": GraphQLArgument(GraphQLNonNull(GraphQLString))},
            resolve=lambda *_a, title="": f"issue: {title}",
        ),
    },
)

SCHEMA = GraphQLSchema(query=Query, mutation=Mutation)


def describe(query, operation_name):
    """`KIND NAME FIELDS` of the operation that runs (as the server picks it)."""
    try:
        doc = parse(query)
    except Exception:  # noqa: BLE001 - a bad document is answered by graphql_sync
        return "invalid - -"
    ops = [d for d in doc.definitions if isinstance(d, OperationDefinitionNode)]
    if operation_name:
        ops = [o for o in ops if o.name and o.name.value == operation_name]
    if not ops:
        return "none - -"
    op = ops[0]
    fields = ",".join(s.name.value for s in op.selection_set.selections if hasattr(s, "name"))
    return f"{op.operation.value} {op.name.value if op.name else '-'} {fields or '-'}"


def execute(one):
    query = one.get("query")
    name = one.get("operationName")
    if not isinstance(query, str):
        return {"errors": [{"message": "no query"}]}
    result = graphql_sync(SCHEMA, query, operation_name=name, variable_values=one.get("variables"))
    if not result.errors or result.data is not None:
        with LOCK:
            print("executed", describe(query, name), flush=True)
    out = {"data": result.data}
    if result.errors:
        out["errors"] = [{"message": e.message} for e in result.errors]
    return out


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *_args):
        pass

    def answer(self, status, payload):
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        url = urlparse(self.path)
        qs = parse_qs(url.query)
        one = {"query": qs.get("query", [None])[0], "operationName": qs.get("operationName", [None])[0]}
        self.answer(200, execute(one))

    def do_POST(self):
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        ctype = (self.headers.get("content-type") or "").split(";")[0].strip().lower()
        if ctype == "application/graphql":
            self.answer(200, execute({"query": raw.decode("utf-8", "replace")}))
            return
        try:
            payload = json.loads(raw)
        except ValueError:
            self.answer(400, {"errors": [{"message": "not JSON"}]})
            return
        if isinstance(payload, list):
            self.answer(200, [execute(p) for p in payload if isinstance(p, dict)])
        else:
            self.answer(200, execute(payload))


def main() -> int:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    with open(sys.argv[1], "w") as f:
        f.write(str(server.server_address[1]))
    print("listening", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
