"""A fake of the two AWS services audit-log export uses, faithful to their documented
APIs: STS `AssumeRole` (Query API, POST form, XML answer; the role's trust policy allows
one principal with one `sts:ExternalId`) and S3 `PutObject` (path-style). Every request
must carry a valid Signature Version 4 (Authorization header) by known credentials;
S3 requests must be signed by credentials STS issued, with their session token. The
fake keeps the objects written, and can be taken down (S3 answers 503 SlowDown) to test
delivery through an outage."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from harness import answer, quiet_handler

BASE_ACCESS_KEY = "AKIAFAKESERVICE00001"
BASE_SECRET_KEY = "fake-service-secret-key-0000000000000000"
PRINCIPAL_ARN = "arn:aws:iam::111111111111:role/browser-service"


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def signature_problem(method: str, raw_path: str, query: str, headers, body: bytes,
                      secrets_by_key: dict[str, str], service: str) -> str | None:
    """Checks a SigV4 Authorization header (AWS General Reference, "Create a signed AWS
    API request"); answers what is wrong, or None. `raw_path` is the path as sent."""
    authorization = headers.get("Authorization", "")
    if not authorization.startswith("AWS4-HMAC-SHA256 "):
        return "missing SigV4 Authorization"
    fields = dict(part.strip().split("=", 1) for part in authorization[len("AWS4-HMAC-SHA256 "):].split(","))
    access_key, date, region, signed_service, terminator = fields["Credential"].split("/")
    if signed_service != service or terminator != "aws4_request":
        return f"signed for {signed_service}"
    secret = secrets_by_key.get(access_key)
    if secret is None:
        return "unknown access key"
    amz_date = headers.get("x-amz-date", "")
    if not amz_date.startswith(date):
        return "x-amz-date does not match the credential scope"
    signed = fields["SignedHeaders"].split(";")
    if "host" not in signed:
        return "host is not signed"
    payload_hash = hashlib.sha256(body).hexdigest()
    if service == "s3":
        if headers.get("x-amz-content-sha256") != payload_hash:
            return "x-amz-content-sha256 does not match the body"
        canonical_path = raw_path  # S3: the path as sent, not encoded again
    else:
        canonical_path = urllib.parse.quote(urllib.parse.quote(raw_path, safe="/~"), safe="/~") \
            if raw_path != "/" else "/"
    pairs = sorted(urllib.parse.parse_qsl(query, keep_blank_values=True))
    canonical_query = "&".join(f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
                               for k, v in pairs)
    canonical_headers = "".join(f"{name}:{' '.join((headers.get(name) or '').split())}\n" for name in signed)
    canonical = "\n".join([method, canonical_path, canonical_query, canonical_headers, ";".join(signed),
                           headers.get("x-amz-content-sha256") or payload_hash])
    scope = f"{date}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = _hmac(_hmac(_hmac(_hmac(f"AWS4{secret}".encode(), date), region), service), "aws4_request")
    expected = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, fields["Signature"]):
        return "signature mismatch"
    return None


class FakeAws:
    def __init__(self):
        self.trusted: dict[str, str] = {}  # role ARN → the external id its trust policy requires
        self.sessions: dict[str, tuple[str, str]] = {}  # access key → (secret, session token)
        self.objects: dict[tuple[str, str], bytes] = {}  # (bucket, key) → body
        self.put_headers: dict[tuple[str, str], dict] = {}
        self.s3_down = False
        self.refused: list[str] = []
        self.lock = threading.Lock()
        fake = self

        Handler = quiet_handler(POST=fake._sts, PUT=fake._s3_put)
        self.sts = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.s3 = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.sts_url = f"http://127.0.0.1:{self.sts.server_address[1]}/"
        self.s3_url = f"http://127.0.0.1:{self.s3.server_address[1]}"

    def __enter__(self) -> "FakeAws":
        for server in (self.sts, self.s3):
            threading.Thread(target=server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *_exc) -> None:
        self.sts.shutdown()
        self.s3.shutdown()

    def trust(self, role_arn: str, external_id: str) -> None:
        """The customer's trust policy: PRINCIPAL_ARN may assume `role_arn` with `external_id`."""
        self.trusted[role_arn] = external_id

    def objects_in(self, bucket: str) -> dict[str, bytes]:
        with self.lock:
            return {key: body for (b, key), body in sorted(self.objects.items()) if b == bucket}

    def _body(self, request) -> bytes:
        return request.rfile.read(int(request.headers.get("Content-Length") or 0))

    def _sts(self, request: BaseHTTPRequestHandler) -> None:
        body = self._body(request)
        url = urllib.parse.urlsplit(request.path)
        problem = signature_problem("POST", url.path, url.query, request.headers, body,
                                    {BASE_ACCESS_KEY: BASE_SECRET_KEY}, "sts")
        form = dict(urllib.parse.parse_qsl(body.decode()))
        if problem is None and form.get("Action") != "AssumeRole":
            problem = "unsupported action"
        if problem is not None:
            self.refused.append(f"sts: {problem}")
            return self._xml(request, 403, f"<ErrorResponse><Error><Code>SignatureDoesNotMatch</Code>"
                                           f"<Message>{problem}</Message></Error></ErrorResponse>")
        role = form.get("RoleArn", "")
        if self.trusted.get(role) is None or self.trusted[role] != form.get("ExternalId"):
            self.refused.append(f"sts: not trusted {role}")
            return self._xml(request, 403, "<ErrorResponse><Error><Code>AccessDenied</Code><Message>User: "
                                           f"{PRINCIPAL_ARN} is not authorized to perform: sts:AssumeRole on "
                                           f"resource: {role}</Message></Error></ErrorResponse>")
        access_key = "ASIA" + secrets.token_hex(8).upper()
        secret, token = secrets.token_urlsafe(30), secrets.token_urlsafe(60)
        with self.lock:
            self.sessions[access_key] = (secret, token)
        self._xml(request, 200, f"""<AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleResult><Credentials><AccessKeyId>{access_key}</AccessKeyId>
  <SecretAccessKey>{secret}</SecretAccessKey><SessionToken>{token}</SessionToken>
  <Expiration>2099-01-01T00:00:00Z</Expiration></Credentials>
  <AssumedRoleUser><Arn>{role}/audit-log-export</Arn><AssumedRoleId>AROA:x</AssumedRoleId></AssumedRoleUser>
  </AssumeRoleResult></AssumeRoleResponse>""")

    def _s3_put(self, request: BaseHTTPRequestHandler) -> None:
        body = self._body(request)
        url = urllib.parse.urlsplit(request.path)
        if self.s3_down:
            return self._xml(request, 503, "<Error><Code>SlowDown</Code><Message>Please reduce your request "
                                           "rate.</Message></Error>")
        with self.lock:
            keys = {key: secret for key, (secret, _) in self.sessions.items()}
        problem = signature_problem("PUT", url.path, url.query, request.headers, body, keys, "s3")
        if problem is None:
            access_key = request.headers["Authorization"].split("Credential=")[1].split("/")[0]
            if request.headers.get("x-amz-security-token") != self.sessions[access_key][1]:
                problem = "missing or wrong x-amz-security-token"
        if problem is not None:
            self.refused.append(f"s3: {problem}")
            return self._xml(request, 403, f"<Error><Code>AccessDenied</Code><Message>{problem}</Message></Error>")
        bucket, _, key = url.path.lstrip("/").partition("/")
        key = urllib.parse.unquote(key)
        with self.lock:
            self.objects[(bucket, key)] = body
            self.put_headers[(bucket, key)] = dict(request.headers)
        request.send_response(200)
        request.send_header("ETag", '"' + hashlib.md5(body).hexdigest() + '"')  # noqa: S324 (S3's ETag)
        request.send_header("Content-Length", "0")
        request.end_headers()

    @staticmethod
    def _xml(request: BaseHTTPRequestHandler, status: int, body: str) -> None:
        answer(request, status, "text/xml", body)
