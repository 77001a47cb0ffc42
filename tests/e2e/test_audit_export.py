"""Audit-log export destinations with today's SDK (`audit_logs.export_destinations`): a
destination's role is assumed through STS with its external id and objects are written
to S3 (a fake of both that checks every SigV4 signature, `fake_aws.py`); `test` reports
the stage that fails; every state-changing call is delivered once, in order, as gzipped
JSON Lines under the documented Hive-style key, also after the bucket's own outage;
pausing stops delivery, and what happens while paused is never delivered; nothing
secret is in what is delivered; another organization sees none of it."""

from __future__ import annotations

import gzip
import json
import os

import pytest
from kernel import BadRequestError, Kernel, NotFoundError

from fake_aws import BASE_ACCESS_KEY, BASE_SECRET_KEY, PRINCIPAL_ARN, FakeAws
from harness import control_plane_for_module, wait_until
from sdk import items, today_only

pytestmark = today_only

ROLE = "arn:aws:iam::222222222222:role/audit-export"
BUCKET = "audit-bucket"
SECRET_PASSWORD = "export-must-never-carry-this-Pa55"


@pytest.fixture(scope="module")
def aws():
    with FakeAws() as fake:
        yield fake


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory, aws):
    environment = {"AWS_ACCESS_KEY_ID": BASE_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": BASE_SECRET_KEY}
    saved = {name: os.environ.get(name) for name in environment}
    os.environ.update(environment)
    try:
        yield from control_plane_for_module(tmp_path_factory, extra_args=[
            "--audit-export-sts-endpoint", aws.sts_url, "--audit-export-s3-endpoint", aws.s3_url,
            "--audit-export-principal-arn", PRINCIPAL_ARN, "--audit-export-delay-seconds", "1"])
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(scope="module")
def org(control_plane) -> Kernel:
    return Kernel(api_key=control_plane.create_api_key("audit-export-org"), base_url=control_plane.base_url,
                  max_retries=0)


def delivered(aws, destination_id: str) -> list[dict]:
    """Every entry delivered for the destination, in the order of its objects."""
    entries = []
    for key, body in aws.objects_in(BUCKET).items():
        if f"destination_id={destination_id}/org_id=" in key:
            entries += [json.loads(line) for line in gzip.decompress(body).decode().splitlines()]
    return entries


def test_a_destination_delivers_every_change_in_order_through_an_outage(org, aws):
    destination = org.audit_logs.export_destinations.create(
        type="s3", format="jsonl.gz", bucket=BUCKET, prefix="logs/kernel", region="eu-west-1", role_arn=ROLE)
    assert destination.status == "active" and destination.kernel_role_arn == PRINCIPAL_ARN
    assert len(destination.external_id) >= 16

    # The customer has not trusted us yet: the test says where it fails.
    result = org.audit_logs.export_destinations.test(destination.id)
    assert not result.success and result.stage == "assume_role" and result.error.code == "assume_role_failed"
    aws.trust(ROLE, destination.external_id)
    result = org.audit_logs.export_destinations.test(destination.id)
    assert result.success and result.stage == "complete", result

    names = [f"exported-{n}" for n in range(3)]
    for name in names[:2]:
        org.profiles.create(name=name)
    org.credentials.create(name="exported-login", domain="example.test",
                           values={"username": "u", "password": SECRET_PASSWORD})
    # The two tests were calls too: five so far.
    assert wait_until(lambda: len(delivered(aws, destination.id)) >= 5, 30, interval=0.5)

    # The bucket goes down: delivery fails, is retried, and catches up in order.
    aws.s3_down = True
    org.profiles.create(name=names[2])
    for name in names:
        org.profiles.delete(name)
    assert wait_until(lambda: org.audit_logs.export_destinations.retrieve(destination.id).consecutive_failures > 0,
                      30, interval=0.5)
    failing = org.audit_logs.export_destinations.retrieve(destination.id)
    assert "SlowDown" in failing.last_error and failing.next_attempt_at is not None
    aws.s3_down = False
    assert wait_until(lambda: len(delivered(aws, destination.id)) >= 9, 60, interval=0.5)
    entries = delivered(aws, destination.id)
    paths = [(entry["method"], entry["path"]) for entry in entries]
    tested = ("POST", f"/audit-logs/export/destinations/{destination.id}/test")
    assert paths == [tested, tested, ("POST", "/profiles"), ("POST", "/profiles"), ("POST", "/credentials"),
                     ("POST", "/profiles")] + [("DELETE", f"/profiles/{name}") for name in names], paths
    assert [entry["timestamp"] for entry in entries] == sorted(entry["timestamp"] for entry in entries)
    assert len({entry["event_id"] for entry in entries}) == len(entries)
    assert all(entry["outcome"] == "allowed" and entry["api_key_id"] for entry in entries)
    # The destination's record says so once the delivery that wrote them has noted it
    # (just after the bucket has them).
    retrieve = org.audit_logs.export_destinations.retrieve
    assert wait_until(lambda: retrieve(destination.id).consecutive_failures == 0, 10, interval=0.2)
    recovered = retrieve(destination.id)
    assert recovered.last_success_at is not None
    assert recovered.last_exported_cursor

    keys = [key for key in aws.objects_in(BUCKET) if f"destination_id={destination.id}/org_id=" in key]
    assert all(key.startswith(f"logs/kernel/destination_id={destination.id}/org_id=") and "/date=" in key
               and "/hour=" in key and key.endswith(".jsonl.gz") for key in keys), keys
    everything = b"".join(gzip.decompress(body) for key, body in aws.objects_in(BUCKET).items() if key in keys)
    assert SECRET_PASSWORD.encode() not in everything and org.api_key.encode() not in everything
    assert not [refusal for refusal in aws.refused if "signature" in refusal], aws.refused

    # Paused, nothing is delivered; resumed, only what happens from then on.
    org.audit_logs.export_destinations.update(destination.id, status="paused")
    org.profiles.create(name="while-paused")
    org.audit_logs.export_destinations.update(destination.id, status="active")
    org.profiles.create(name="after-resume")
    assert wait_until(lambda: any(e["path"] == "/profiles" and e["method"] == "POST"
                                  for e in delivered(aws, destination.id)[9:]), 30, interval=0.5)
    later = delivered(aws, destination.id)[9:]
    assert [(e["method"], e["path"]) for e in later].count(("POST", "/profiles")) == 1
    # Nor the records of the pause and the resume themselves: they landed while paused.
    org.profiles.delete("while-paused")
    org.profiles.delete("after-resume")
    org.audit_logs.export_destinations.delete(destination.id)


def test_destinations_are_the_organization_s_own_and_bad_input_is_400(org, control_plane):
    destination = org.audit_logs.export_destinations.create(
        type="s3", format="jsonl.gz", bucket="own-bucket", prefix="", region="us-east-1", role_arn=ROLE,
        kms_key_id="alias/audit")
    assert destination.kms_key_id == "alias/audit"
    assert org.audit_logs.export_destinations.update(destination.id, kms_key_id="").kms_key_id is None
    assert destination.id in [d.id for d in items(org.audit_logs.export_destinations.list())]
    other = Kernel(api_key=control_plane.create_api_key("audit-export-other"), base_url=control_plane.base_url,
                   max_retries=0)
    with pytest.raises(NotFoundError):
        other.audit_logs.export_destinations.retrieve(destination.id)
    with pytest.raises(NotFoundError):
        other.audit_logs.export_destinations.delete(destination.id)
    assert items(other.audit_logs.export_destinations.list()) == []
    for bad in ({"bucket": "Not_A_Bucket"}, {"region": "Europe West"}, {"role_arn": "role/audit"}):
        fields = {"type": "s3", "format": "jsonl.gz", "bucket": "b-ok", "prefix": "p", "region": "us-east-1",
                  "role_arn": ROLE, **bad}
        with pytest.raises(BadRequestError):
            org.audit_logs.export_destinations.create(**fields)
    with pytest.raises(BadRequestError):
        org.audit_logs.export_destinations.update(destination.id, status="stopped")
    org.audit_logs.export_destinations.delete(destination.id)
    with pytest.raises(NotFoundError):
        org.audit_logs.export_destinations.retrieve(destination.id)
