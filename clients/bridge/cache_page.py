"""The cache page: `/ui` (one static HTML file, its script and style inline) and `/ui/tree`
(the JSON it polls: the CacheTree RPC for the caller).

The page holds no data, so it is served without a token (clients.bridge.guard's
OPEN_PATHS); its script asks `/ui/tree` with the token the operator types in
(kept in the browser's session storage), and the engine decides what that
token may see: the operator every namespace (or the one named by
`?namespace=`), a tenant its own (engine.server.rpc.service `tree_scope`; the
bridge also narrows a tenant it knows itself). It knows the backend's
`cache_tree` and HTTP; nothing of the engine's internals.
"""

from pathlib import Path

from clients.bridge.guard import caller_of

PAGE = Path(__file__).with_name("cache_page.html")
MAX_RECENT = 200


def add_routes(app, backend) -> None:
    from fastapi import Request
    from fastapi.responses import HTMLResponse

    page = PAGE.read_text()

    @app.get("/ui")
    async def cache_page():
        headers = {"cache-control": "no-store", "x-content-type-options": "nosniff"}
        return HTMLResponse(page, headers=headers)

    @app.get("/ui/tree")
    async def cache_tree(request: Request):
        caller = caller_of(request)
        namespace = request.query_params.get("namespace")
        identity = caller.identity
        if identity is not None and not identity.admin:  # a tenant the bridge knows: its own
            namespace = identity.namespace
        try:
            recent = min(MAX_RECENT, max(0, int(request.query_params.get("recent", 50))))
        except ValueError:
            recent = 50
        return await backend.cache_tree(caller, namespace, recent)
