"""`organization.limits` and `organization.entitlements` with today's SDK: the limits are
the ones the server enforces (a cap set over the API refuses the browser past it with 429
and the pool past it with 409, counting pool reservations and on-demand browsers
together), the usage is real, and the entitlements say what this server serves.
"""

from __future__ import annotations

import pytest
from kernel import BadRequestError, ConflictError, Kernel, RateLimitError

from sdk import today_only

pytestmark = today_only

# The server's defaults: --max-live-browsers 20, --max-pooled-browsers 50.
SERVER_MAX = 20 + 50


@pytest.fixture(scope="module")
def org(control_plane) -> Kernel:
    """An organization of its own, so that other tests' browsers are not counted."""
    return Kernel(api_key=control_plane.create_api_key("limits-org"), base_url=control_plane.base_url,
                  max_retries=0)


def test_entitlements_say_what_this_server_serves(org):
    entitlements = org.organization.entitlements.retrieve()
    features = entitlements.features
    assert features.gpu.enabled is False and features.vaults.enabled is False and features.search.enabled is False
    assert features.browser_pools.enabled and features.profiles.enabled and features.file_io.enabled
    # The suite's server has no 1Password Connect URL and no upstream proxies.
    assert features.credential_providers.enabled is False
    assert features.managed_proxies.enabled is False
    assert features.managed_auth.health_check_interval_min_seconds == 300
    assert entitlements.limits.max_concurrent_browsers == SERVER_MAX
    assert entitlements.limits.max_concurrent_invocations == 8
    assert entitlements.plan.id == "ENTERPRISE" and entitlements.plan.is_trialing is False


def test_a_cap_set_over_the_api_is_enforced_and_usage_is_real(org):
    limits = org.organization.limits.retrieve()
    assert limits.max_concurrent_sessions == SERVER_MAX
    assert limits.default_project_max_concurrent_sessions is None
    assert limits.concurrent_sessions_used == 0 and limits.concurrent_sessions_available == SERVER_MAX

    capped = org.organization.limits.update(default_project_max_concurrent_sessions=2)
    assert capped.default_project_max_concurrent_sessions == 2 and capped.concurrent_sessions_available == 2
    pool = org.browser_pools.create(name="limits-pool", size=1)
    first = org.browsers.create(headless=True)
    try:
        limits = org.organization.limits.retrieve()
        assert limits.concurrent_sessions_used == 2 and limits.concurrent_sessions_available == 0
        with pytest.raises(RateLimitError) as refused:
            org.browsers.create(headless=True)
        assert refused.value.response.headers.get("retry-after")
        assert "max_concurrent_sessions is 2" in str(refused.value)
        with pytest.raises(ConflictError):
            org.browser_pools.update(pool.id, size=2)
        # Removing the cap (0) lets the next one through; `null` leaves it as it is.
        assert org.organization.limits.update(default_project_max_concurrent_sessions=None) \
            .default_project_max_concurrent_sessions == 2
        org.organization.limits.update(default_project_max_concurrent_sessions=0)
        second = org.browsers.create(headless=True)
        org.browsers.delete_by_id(second.session_id)
    finally:
        org.browsers.delete_by_id(first.session_id)
        org.browser_pools.delete(pool.id, force=True)


def test_bad_limits_are_400(org):
    for bad in (-1, SERVER_MAX + 1):
        with pytest.raises(BadRequestError):
            org.organization.limits.update(default_project_max_concurrent_sessions=bad)
    with pytest.raises(BadRequestError):
        org.patch("/org/limits", body={"max_concurrent_sessions": 5}, cast_to=object)
