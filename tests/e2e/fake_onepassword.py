"""A fake 1Password Connect server: the documented endpoints the control plane uses
(https://developer.1password.com/docs/connect/api-reference): list vaults, list a
vault's items, get an item with its fields; bearer-token auth with Connect's error shape.
It counts the calls it answers, so tests can see what the control plane's cache saves."""

from __future__ import annotations

import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from harness import send_json


class FakeConnect:
    def __init__(self, token: str, vaults: dict[str, dict]):
        """`vaults`: vault name → {item title → {"username", "password", "otp"?, "urls"?}}."""
        self.token = token
        self.calls: Counter[str] = Counter()
        self._vaults = []
        self._items: dict[str, list[dict]] = {}
        for index, (vault_name, items) in enumerate(vaults.items()):
            vault_id = f"vault{index:022d}aaaa"
            self._vaults.append({"id": vault_id, "name": vault_name, "attributeVersion": 1,
                                 "contentVersion": 1, "type": "USER_CREATED"})
            self._items[vault_id] = [self._item(vault_id, f"item{index}{n:021d}bbbb", title, item)
                                     for n, (title, item) in enumerate(items.items())]
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                fake._answer(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @staticmethod
    def _item(vault_id: str, item_id: str, title: str, item: dict) -> dict:
        fields = [
            {"id": "username", "type": "STRING", "purpose": "USERNAME", "label": "username",
             "value": item["username"]},
            {"id": "password", "type": "CONCEALED", "purpose": "PASSWORD", "label": "password",
             "value": item["password"]},
        ]
        if "otp" in item:
            fields.append({"id": "otp", "type": "OTP", "label": "one-time password", "value": item["otp"]})
        return {"id": item_id, "title": title, "vault": {"id": vault_id}, "category": "LOGIN",
                "urls": [{"href": url, "primary": n == 0} for n, url in enumerate(item.get("urls", []))],
                "fields": fields, "version": 1}

    def _answer(self, request: BaseHTTPRequestHandler) -> None:
        path = request.path.split("?", 1)[0]
        parts = path.strip("/").split("/")
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return self._send(request, 401, {"status": 401, "message": "Invalid token signature"})
        self.calls[self._shape(parts)] += 1
        if parts == ["v1", "vaults"]:
            return self._send(request, 200, self._vaults)
        if len(parts) == 4 and parts[:2] == ["v1", "vaults"] and parts[3] == "items":
            items = self._items.get(parts[2])
            if items is None:
                return self._send(request, 404, {"status": 404, "message": "Invalid Vault UUID"})
            # Lists carry no field values, as Connect's do.
            return self._send(request, 200, [{k: v for k, v in i.items() if k != "fields"} for i in items])
        if len(parts) == 5 and parts[:2] == ["v1", "vaults"] and parts[3] == "items":
            for item in self._items.get(parts[2], []):
                if item["id"] == parts[4]:
                    return self._send(request, 200, item)
            return self._send(request, 404, {"status": 404, "message": "Item not found"})
        self._send(request, 404, {"status": 404, "message": "Not found"})

    @staticmethod
    def _shape(parts: list[str]) -> str:
        if len(parts) == 2:
            return "vaults"
        return "items" if len(parts) == 4 else "item"

    _send = staticmethod(send_json)

    def __enter__(self) -> "FakeConnect":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
