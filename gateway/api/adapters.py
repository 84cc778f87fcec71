"""The control plane of LoRA adapters (an admin credential; gateway/adapters says what they are).

    GET    /admin/adapters          every adapter the cluster defines, and which workers hold it
    PUT    /admin/adapters/{name}   define (or redefine) one: {"base", "path", "pinned", "load": "lazy" | "now"};
                                    "now" loads it on every worker of its base that takes adapters before answering
                                    (each worker's outcome in "loaded"); a redefined one is unloaded where it was
    DELETE /admin/adapters/{name}   remove one, unloaded from every worker that holds it
    POST   /admin/adapters/{name}/load    load it now everywhere (as "load": "now")
    POST   /admin/adapters/{name}/unload  unload it everywhere (requests load it again where they go)
"""

from __future__ import annotations

from ..adapters.spec import AdapterInvalid, check_name, new_spec
from ..base.errors import NotKnown
from .errors import BadRequest
from .http import Request
from .protocol import parse_json_body
from .state import GatewayState

LOAD_MODES = ("lazy", "now")


def _spec_named(state: GatewayState, request: Request):
    name = request.path_params["name"]
    spec = state.adapters.specs.get(name)
    if spec is None:
        raise NotKnown(f"no adapter {name!r}", code="adapter_not_found")
    return spec


async def list_adapters(state: GatewayState, request: Request) -> None:
    await request.send_json(200, {"adapters": state.adapters.describe()})


async def put_adapter(state: GatewayState, request: Request) -> None:
    name = request.path_params["name"]
    body = parse_json_body(await request.body())
    load = body.get("load", "lazy")
    if load not in LOAD_MODES:
        raise BadRequest("'load' is lazy (on the first request) or now", param="load")
    try:
        check_name(name)
        spec = new_spec(name, body.get("base"), body.get("path"), body.get("pinned", False))
    except AdapterInvalid as e:
        raise BadRequest(str(e), param="name" if "name" in str(e) else None, code="invalid_adapter") from None
    if state.catalog.get(name) is not None:
        raise BadRequest(f"{name!r} is a model's name: an adapter needs a name of its own", param="name",
                         code="invalid_adapter")
    adapters = state.adapters
    try:
        replaced = adapters.define(spec)
    except AdapterInvalid as e:
        raise BadRequest(str(e), code="too_many_adapters") from None
    out = {"adapter": next(a for a in adapters.describe() if a["name"] == name)}
    if replaced is not None and replaced.adapter_id != spec.adapter_id:
        out["unloaded"] = await adapters.unload_everywhere(replaced)
    if load == "now":
        out["loaded"] = await adapters.load_everywhere(spec)
        out["adapter"] = next(a for a in adapters.describe() if a["name"] == name)
    await request.send_json(200, out)


async def delete_adapter(state: GatewayState, request: Request) -> None:
    spec = state.adapters.remove(_spec_named(state, request).name)
    await request.send_json(200, {"removed": spec.name, "unloaded": await state.adapters.unload_everywhere(spec)})


async def load_adapter(state: GatewayState, request: Request) -> None:
    spec = _spec_named(state, request)
    await request.send_json(200, {"loaded": await state.adapters.load_everywhere(spec)})


async def unload_adapter(state: GatewayState, request: Request) -> None:
    spec = _spec_named(state, request)
    await request.send_json(200, {"unloaded": await state.adapters.unload_everywhere(spec)})
