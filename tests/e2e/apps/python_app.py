"""A Python app for the apps tests: deployed as a ZIP, its actions run in the service."""

import json
import os
import time

import kernel
from kernel import Kernel

app = kernel.App("e2e-python")


@app.action("hello")
def hello(ctx: kernel.KernelContext, payload: dict):
    print(f"hello from {ctx.invocation_id}", flush=True)
    return {
        "greeting": f"{os.environ.get('GREETING', '?')} {payload['name']}",
        "invocation_id": ctx.invocation_id,
    }


@app.action("page-title")
def page_title(ctx: kernel.KernelContext, payload: dict):
    client = Kernel()
    browser = client.browsers.create(headless=True)
    answer = client.browsers.playwright.execute(
        browser.session_id,
        code=f"await page.goto({payload['url']!r}); return await page.title();",
    )
    mine = client.invocations.list_browsers(ctx.invocation_id).browsers
    return {"title": answer.result, "error": answer.error, "session_id": browser.session_id,
            "listed": [b.session_id for b in mine]}


@app.action("sleepy")
def sleepy(ctx: kernel.KernelContext, payload: dict):
    client = Kernel()
    browser = client.browsers.create(headless=True)
    print(f"started {browser.session_id}", flush=True)
    time.sleep(payload.get("seconds", 120))
    return "woke up"


@app.action("boom")
def boom(ctx: kernel.KernelContext):
    raise ValueError("the secret sauce is 42")


@app.action("snoop")
def snoop(ctx: kernel.KernelContext, payload: dict):
    """What this action can see of the host and of other deployments."""
    seen = {}
    for path in payload["paths"]:
        try:
            if os.path.isdir(path):
                seen[path] = sorted(os.listdir(path))[:20]
            else:
                with open(path, "rb") as file:
                    seen[path] = file.read(64).hex()
        except OSError as error:
            seen[path] = f"error: {type(error).__name__}"
    seen["key"] = os.environ["KERNEL_API_KEY"]
    seen["uid"] = os.getuid()
    seen["root"] = sorted(os.listdir("/"))
    seen["processes"] = [name for name in os.listdir("/proc") if name.isdigit()]
    return seen


@app.action("write-app")
def write_app(ctx: kernel.KernelContext):
    try:
        with open("main.py", "a") as file:
            file.write("# changed")
        return "written"
    except OSError as error:
        return f"error: {type(error).__name__}"


@app.action("other-org")
def other_org(ctx: kernel.KernelContext, payload: dict):
    """Tries to reach another organization's browser with this invocation's key."""
    client = Kernel()
    try:
        client.browsers.retrieve(payload["session_id"])
        return "reached"
    except kernel.NotFoundError:
        return "not found"


@app.action("hog")
def hog(ctx: kernel.KernelContext):
    """Takes 3 GiB, more than a run may use."""
    blocks = [b"\x01" * (64 << 20) for _ in range(48)]
    time.sleep(10)
    return len(blocks)


@app.action("memfd_hog")
def memfd_hog(ctx: kernel.KernelContext):
    """Puts 3 GiB where no process maps it: a memfd."""
    fd = os.memfd_create("hoard")
    block = b"\x01" * (64 << 20)
    for _ in range(48):
        os.write(fd, block)
    time.sleep(10)
    return os.fstat(fd).st_size
