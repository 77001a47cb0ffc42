"""Credentials (`/credentials`) and credential providers (`/org/credential_providers`):
write-only values and TOTP seeds, one-time codes checked against pyotp, organizations
kept apart, and a 1Password provider read through a fake Connect server."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import httpx
import pyotp
import pytest
from kernel import Kernel

from fake_onepassword import FakeConnect
from harness import control_plane_for_module
from sdk import field, fields, items

SEED = "JBSWY3DPEHPK3PXPJBSWY3DPEHPK3PXP"
PASSWORD = "correct horse battery staple 7f3a"
CONNECT_TOKEN = "connect-token-for-tests"
VAULTS = {
    "Work": {
        "Example login": {"username": "alice@example.com", "password": "from-1password-9d2c",
                          "otp": f"otpauth://totp/Example:alice?secret={SEED}&issuer=Example",
                          "urls": ["https://example.com/login"]},
        "Other site": {"username": "bob", "password": "other-5e1b"},
    },
    "Personal": {"Bank": {"username": "carol", "password": "bank-0c4d"}},
}


@pytest.fixture(scope="module")
def connect():
    with FakeConnect(CONNECT_TOKEN, VAULTS) as server:
        yield server


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory, connect):
    yield from control_plane_for_module(
        tmp_path_factory, extra_args=[f"--onepassword-connect-url={connect.url}"])


@pytest.fixture(scope="module")
def client(control_plane) -> Kernel:
    return Kernel(api_key=control_plane.api_key, base_url=control_plane.base_url, max_retries=0)


def raw(control_plane, method: str, path: str, **kwargs) -> httpx.Response:
    headers = {"Authorization": f"Bearer {control_plane.api_key}"}
    return httpx.request(method, f"{control_plane.base_url}{path}", headers=headers, timeout=30, **kwargs)


def test_values_and_seeds_are_write_only(client, control_plane):
    created = client.credentials.create(name="shop", domain="Shop.Example.com",
                                        values={"username": "alice", "password": PASSWORD},
                                        totp_secret=SEED)
    try:
        assert created.domain == "shop.example.com" and created.has_values and created.has_totp_secret
        # The answer that set the seed has the current code, and nothing of the secrets.
        assert created.totp_code == pyotp.TOTP(SEED).now()
        assert created.totp_code_expires_at > datetime.now(timezone.utc)
        dumped = str(created.to_dict())
        assert PASSWORD not in dumped and SEED not in dumped
        assert field(created, "value_keys") == ["password", "username"]

        fetched = client.credentials.retrieve("shop")
        assert fetched.id == created.id and fetched.totp_code is None
        assert field(fetched, "value_keys") == ["password", "username"]
        listed = [c for c in items(client.credentials.list()) if c.id == created.id]
        assert len(listed) == 1 and field(listed[0], "value_keys") is None

        # PATCH merges values, removes keys, renames; no code without a new seed.
        updated = client.credentials.update(created.id, name="shop-2", values={"otp_label": "x"},
                                            **fields(remove_value_keys=["username"]))
        assert updated.name == "shop-2" and updated.totp_code is None
        assert field(updated, "value_keys") == ["otp_label", "password"]
        code = client.credentials.totp_code("shop-2")
        assert code.code == pyotp.TOTP(SEED).now()

        # Names are unique in the organization.
        with pytest.raises(Exception) as taken:
            client.credentials.create(name="shop-2", domain="example.com", values={})
        assert getattr(taken.value, "status_code", None) == 409

        # Nowhere in clear: not in any answer above, not in the database (with its journal),
        # not in the log.
        stored_files = [*control_plane.data_dir.glob("control-plane.db*"), control_plane.data_dir / "control-plane.log"]
        assert len(stored_files) >= 2
        for path in stored_files:
            stored = path.read_bytes()
            assert PASSWORD.encode() not in stored and SEED.encode() not in stored, path

        # Settings alone change the stored seed's codes (and give no code).
        resettled = raw(control_plane, "PATCH", f"/credentials/{created.id}", json={"totp_digits": 8})
        assert resettled.status_code == 200 and resettled.json()["totp_digits"] == 8
        assert "totp_code" not in resettled.json()
        assert client.credentials.totp_code(created.id).code == pyotp.TOTP(SEED, digits=8).now()
        # Removing the seed removes its settings.
        cleared = client.credentials.update(created.id, totp_secret="")
        assert not cleared.has_totp_secret and field(cleared, "totp_algorithm") is None
        assert raw(control_plane, "GET", f"/credentials/{created.id}/totp-code").status_code == 404
    finally:
        client.credentials.delete(created.id)
    assert raw(control_plane, "GET", f"/credentials/{created.id}").status_code == 404


@pytest.mark.parametrize("algorithm,digits,period", [
    ("SHA1", 6, 30), ("SHA256", 8, 30), ("SHA512", 6, 60), ("SHA1", 8, 60), ("SHA512", 8, 30)])
def test_codes_match_the_reference_implementation(control_plane, algorithm, digits, period):
    body = {"name": f"totp-{algorithm}-{digits}-{period}", "domain": "example.com", "values": {},
            "totp_secret": SEED, "totp_algorithm": algorithm, "totp_digits": digits, "totp_period": period}
    created = raw(control_plane, "POST", "/credentials", json=body)
    assert created.status_code == 200, created.text
    reference = pyotp.TOTP(SEED, digits=digits, interval=period, digest=algorithm.lower())
    answer = created.json()
    assert (answer["totp_algorithm"], answer["totp_digits"], answer["totp_period"]) == (algorithm, digits, period)
    for _ in range(2):  # a code read at a period's edge could be the next one's
        code = raw(control_plane, "GET", f"/credentials/{answer['id']}/totp-code").json()
        if code["code"] == reference.now():
            break
    assert code["code"] == reference.now()
    expires = datetime.fromisoformat(code["expires_at"].replace("Z", "+00:00")).timestamp()
    assert expires % period == 0 and 0 < expires - time.time() <= period
    assert raw(control_plane, "DELETE", f"/credentials/{answer['id']}").status_code in (200, 204)


def test_an_otpauth_uri_sets_the_seed_and_its_parameters_win(control_plane):
    uri = f"otpauth://totp/Example:alice?secret={SEED}&issuer=Example&algorithm=SHA256&digits=8&period=60"
    created = raw(control_plane, "POST", "/credentials", json={
        "name": "from-uri", "domain": "example.com", "values": {}, "totp_secret": uri,
        "totp_digits": 6, "totp_algorithm": "SHA1"}).json()
    assert (created["totp_algorithm"], created["totp_digits"], created["totp_period"]) == ("SHA256", 8, 60)
    assert created["totp_code"] == pyotp.parse_uri(uri).now()
    raw(control_plane, "DELETE", f"/credentials/{created['id']}")


def test_bad_input_gets_the_error_shape(control_plane):
    base = {"name": "bad", "domain": "example.com", "values": {}}
    for body, needle in [
        ({**base, "totp_secret": "not base32 at all!!"}, "totp_secret"),
        ({**base, "totp_secret": "JBSW"}, "totp_secret"),
        ({**base, "totp_secret": SEED, "totp_algorithm": "MD5"}, "totp_algorithm"),
        ({**base, "totp_secret": SEED, "totp_digits": 12}, "totp_digits"),
        ({**base, "totp_secret": "otpauth://hotp/x?secret=" + SEED}, "totp"),
        ({"name": "bad", "values": {}}, "domain"),
        ({"domain": "example.com", "values": {}}, "name"),
        ({**base, "domain": "https://example.com/login"}, "domain"),
        ({**base, "values": {"": "x"}}, "values"),
        ({**base, "surprise": 1}, "surprise"),
    ]:
        answer = raw(control_plane, "POST", "/credentials", json=body)
        assert answer.status_code == 400, (body, answer.text)
        error = answer.json()
        assert error["code"] == "bad_request" and needle in answer.text, (body, error)
    answer = raw(control_plane, "POST", "/org/credential_providers",
                 json={"name": "p", "token": "t", "provider_type": "lastpass"})
    assert answer.status_code == 400 and "provider_type" in answer.json()["message"]
    answer = raw(control_plane, "POST", "/org/credential_providers", json={"name": "p", "provider_type": "onepassword"})
    assert answer.status_code == 400 and "token" in answer.text
    # Giving TOTP settings without a seed is refused.
    created = raw(control_plane, "POST", "/credentials", json=base).json()
    answer = raw(control_plane, "PATCH", f"/credentials/{created['id']}", json={"totp_digits": 8})
    assert answer.status_code == 400 and "totp_secret" in answer.json()["message"]
    answer = raw(control_plane, "POST", "/credentials", json={**base, "name": "bad-2", "totp_period": 60})
    assert answer.status_code == 400 and "totp_secret" in answer.json()["message"]
    raw(control_plane, "DELETE", f"/credentials/{created['id']}")


def test_organizations_do_not_see_each_others(client, control_plane):
    mine = client.credentials.create(name="mine", domain="example.com", values={"password": PASSWORD},
                                     totp_secret=SEED)
    provider = client.credential_providers.create(name="my-1p", token=CONNECT_TOKEN, provider_type="onepassword")
    other = Kernel(api_key=control_plane.create_api_key("org-credentials-b"), base_url=control_plane.base_url,
                   max_retries=0)
    try:
        for call in (lambda: other.credentials.retrieve(mine.id), lambda: other.credentials.retrieve("mine"),
                     lambda: other.credentials.totp_code(mine.id), lambda: other.credentials.delete(mine.id),
                     lambda: other.credentials.update(mine.id, name="stolen"),
                     lambda: other.credential_providers.retrieve(provider.id),
                     lambda: other.credential_providers.test(provider.id),
                     lambda: other.credential_providers.list_items(provider.id),
                     lambda: other.credential_providers.delete(provider.id)):
            with pytest.raises(Exception) as refused:
                call()
            assert getattr(refused.value, "status_code", None) == 404
        assert items(other.credentials.list()) == []
        assert items(other.credential_providers.list()) == []
        # The same name is free in another organization.
        theirs = other.credentials.create(name="mine", domain="example.com", values={})
        assert theirs.id != mine.id
        assert client.credentials.retrieve("mine").id == mine.id
    finally:
        client.credentials.delete(mine.id)
        client.credential_providers.delete(provider.id)


def test_a_onepassword_provider_lists_items_tests_its_token_and_caches(client, control_plane, connect):
    provider = client.credential_providers.create(name="team-1p", token=CONNECT_TOKEN,
                                                  provider_type="onepassword", cache_ttl_seconds=2)
    try:
        assert (provider.provider_type, provider.enabled, provider.priority) == ("onepassword", True, 0)
        assert CONNECT_TOKEN not in str(provider.to_dict())
        assert field(provider, "cache_ttl_seconds") == 2
        tested = client.credential_providers.test(provider.id)
        assert tested.success and {v.name for v in tested.vaults} == {"Work", "Personal"}

        connect.calls.clear()
        listed = client.credential_providers.list_items(provider.id).items
        paths = {item.path: item for item in listed}
        assert set(paths) == {"Work/Example login", "Work/Other site", "Personal/Bank"}
        assert paths["Work/Example login"].urls == ["https://example.com/login"]
        assert paths["Work/Example login"].vault_name == "Work"
        # Within the TTL the list comes from the cache: the server is not asked again.
        client.credential_providers.list_items(provider.id)
        assert connect.calls["vaults"] == 1 and connect.calls["items"] == 2
        time.sleep(2.2)
        client.credential_providers.list_items(provider.id)
        assert connect.calls["vaults"] == 2 and connect.calls["items"] == 4

        # A wrong token: `test` says so with the server's message; items are a 502.
        updated = client.credential_providers.update(provider.id, token="wrong", priority=5, enabled=False)
        assert (updated.priority, updated.enabled) == (5, False)
        failed = client.credential_providers.test(provider.id)
        assert not failed.success and "Invalid token signature" in failed.error and failed.vaults == []
        assert raw(control_plane, "GET", f"/org/credential_providers/{provider.id}/items").status_code == 502

        listed = items(client.credential_providers.list())
        assert [p.id for p in listed] == [provider.id]
        # Names are unique.
        with pytest.raises(Exception) as taken:
            client.credential_providers.create(name=" team-1p ", token="x", provider_type="onepassword")
        assert getattr(taken.value, "status_code", None) == 409
    finally:
        client.credential_providers.delete(provider.id)
    assert raw(control_plane, "GET", f"/org/credential_providers/{provider.id}").status_code == 404
    # The token is sealed like credentials.
    for path in control_plane.data_dir.glob("control-plane.db*"):
        assert CONNECT_TOKEN.encode() not in path.read_bytes(), path
