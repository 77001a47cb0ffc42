"""The service's loader for Python apps (it is not the app's code).

`boot.py describe ENTRYPOINT` imports the entrypoint and writes the apps and actions it
registered with the SDK's app framework (`kernel.App`, `@app.action`) to the result file.
`boot.py invoke ENTRYPOINT APP ACTION` imports it and runs one action with the payload
file's JSON, then writes the action's return value, as JSON, or the traceback of what it
raised.
"""

import asyncio
import importlib.util
import inspect
import json
import os
import sys
import traceback

RUN = "/run/app"
RESULT = os.path.join(RUN, "result.json")
PAYLOAD = os.path.join(RUN, "payload.json")


def write_result(value):
    partial = RESULT + ".partial"
    with open(partial, "w", encoding="utf-8") as out:
        json.dump(value, out)
    os.replace(partial, RESULT)


def load(entrypoint):
    path = os.path.abspath(entrypoint)
    for directory in (os.path.dirname(path), os.getcwd()):
        if directory not in sys.path:
            sys.path.insert(0, directory)
    spec = importlib.util.spec_from_file_location("__main_app__", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    from kernel.app_framework import app_registry

    return app_registry


def invoke(registry, app_name, action_name):
    from kernel.app_framework import KernelContext

    app = registry.get_app_by_name(app_name)
    action = app.get_action(action_name) if app else None
    if action is None:
        return {"ok": False, "error": f"the app {app_name!r} has no action {action_name!r}"}
    payload = None
    if os.path.exists(PAYLOAD):
        with open(PAYLOAD, encoding="utf-8") as source:
            text = source.read()
        payload = json.loads(text) if text else None
    context = KernelContext(invocation_id=os.environ.get("KERNEL_INVOCATION_ID", ""))
    # The framework's wrapper passes the payload only to handlers that take one.
    result = action.handler(context, payload)
    if inspect.isawaitable(result):
        result = asyncio.run(_awaited(result))
    return {"ok": True, "output": json.dumps(result, default=str)}


async def _awaited(awaitable):
    return await awaitable


def main():
    mode, entrypoint = sys.argv[1], sys.argv[2]
    try:
        registry = load(entrypoint)
        if mode == "describe":
            apps = [
                {"name": app.name, "actions": [action.name for action in app.get_actions()]}
                for app in registry.get_apps()
            ]
            write_result({"ok": True, "apps": apps})
        else:
            write_result(invoke(registry, sys.argv[3], sys.argv[4]))
    except BaseException:  # noqa: BLE001 - everything the app raises is its result
        write_result({"ok": False, "error": traceback.format_exc()})
    sys.stdout.flush()
    sys.stderr.flush()


if __name__ == "__main__":
    main()
