"""RDLM's own Python client, rdlm-py 0.2.0, against `putex serve`.

    PYTHONPATH=.tools/rdlm-py python3 rdlm_py.py HOST PORT ADMIN_USER ADMIN_PASSWORD

Run by `rdlm_py_client_works_against_putex_serve` (crates/putex/tests/serve.rs)
on a gateway whose store is older than W + G', so that a fresh resource is
proven vacant (docs/safety.md, S4). Every call is rdlm-py's own; each check
says what RDLM promises. Prints one line per step; exits non-zero with the
failing check on the first failure.
"""
import sys
import threading
import time

import requests
from rdlmpy import (RDLMClient, RDLMContextManager, RDLMLockDeletedException,
                    RDLMLockWaitExceededException)

host, port, admin, password = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
client = RDLMClient(server=host, port=port, default_title="rdlm-py test", default_lifetime=10, default_wait=1)
other = RDLMClient(server=host, port=port, default_title="rdlm-py other", default_lifetime=10, default_wait=1)


def step(what):
    print(what, flush=True)


# Fresh resources with `wait: 1`, as RDLM grants them: at once.
for name in ("fresha", "freshb", "freshc"):
    t = time.monotonic()
    url = client.lock_acquire(name)
    step(f"{name}: granted with wait 1 in {(time.monotonic() - t) * 1000:.1f} ms: {url}")
    assert url.startswith(f"http://{host}:{port}/locks/{name}/"), url
    assert client.lock_release(url), "release of a held lock: 204"

# A held lock's details.
url = client.lock_acquire("details", lifetime=10, wait=1, title="nightly backup")
lock = client.lock_get(url)
assert lock is not None and lock.active, lock
assert lock.title == "nightly backup" and lock.lifetime == 10 and lock.wait == 1, vars(lock)
assert url.endswith("/" + lock.uid), (url, lock.uid)
assert lock.active_since <= lock.active_expires, vars(lock)
step(f"details: active since {lock.active_since}, expires {lock.active_expires}")

# Another client waits its `wait` and gets RDLM's 408.
t = time.monotonic()
try:
    other.lock_acquire("details", wait=1)
    raise AssertionError("a held lock was granted to another client")
except RDLMLockWaitExceededException:
    waited = time.monotonic() - t
assert 0.9 <= waited < 5, waited
step(f"details: a second client gave up after its wait of 1 s ({waited:.2f} s)")

# Released: gone, and free for the other client at once.
assert client.lock_release(url)
assert client.lock_get(url) is None, "a released lock is 404"
assert not client.lock_release(url), "a second release is not 204"
url = other.lock_acquire("details", wait=1)
assert other.lock_release(url)
step("details: released, 404 afterwards, granted to the other client")

# An admin deletes a resource while a request waits on it: the waiter
# gets RDLM's 409; without credentials the delete is refused.
url = client.lock_acquire("held", wait=1)
outcome = {}


def wait_on_held():
    try:
        outcome["url"] = other.lock_acquire("held", wait=10)
    except RDLMLockDeletedException:
        outcome["deleted"] = True
    except Exception as e:  # reported below
        outcome["error"] = repr(e)


def requests_on(resource):
    """How many requests (held and waiting) the server lists for a resource."""
    r = requests.get(f"http://{host}:{port}/resources/{resource}", auth=(admin, password), timeout=5)
    return len(r.json().get("_embedded", {}).get("locks", [])) if r.status_code == 200 else 0


waiter = threading.Thread(target=wait_on_held)
waiter.start()
deadline = time.monotonic() + 10
while requests_on("held") < 2:
    assert time.monotonic() < deadline, "the waiting request was never listed"
    time.sleep(0.05)
assert not client.resource_delete("held"), "a delete without credentials is refused"
assert client.resource_delete("held", username=admin, password=password), "the admin's delete: 204"
waiter.join(15)
assert outcome == {"deleted": True}, outcome
assert client.lock_get(url) is None, "the deleted holder's lock is gone"
step("held: deleted by the admin; the waiting request got 409")

# The context manager: held inside, free after.
with RDLMContextManager("ctx", server=host, port=port, lifetime=10, wait=1):
    try:
        other.lock_acquire("ctx", wait=1)
        raise AssertionError("a lock held by a context manager was granted")
    except RDLMLockWaitExceededException:
        pass
url = other.lock_acquire("ctx", wait=1)
assert other.lock_release(url)
step("ctx: held inside the with block, free after it")

# Everything deleted by the admin.
url = client.lock_acquire("last", wait=1)
assert client.resource_delete_all(admin, password)
assert client.lock_get(url) is None
step("all resources deleted by the admin")
print("rdlm-py: every check passed")
