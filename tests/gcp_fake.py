"""A stateful fake of the Compute Engine REST API behind ``responses``, for the GCP provider.

It answers the requests google-cloud-compute's REST transport sends with bodies shaped like the
real API's (Compute Engine v1 reference: ``instances.insert``/``get``/``delete``/
``aggregatedList``, ``zoneOperations.wait``/``list``, ``machineTypes``/``acceleratorTypes``
``aggregatedList``): an insert answers an Operation ``PENDING`` that ``wait`` turns ``DONE``; a
repeated ``requestId`` answers the first operation; an existing name answers 409
``alreadyExists``; an unknown instance 404 ``notFound``; a zone in ``exhausted`` ends the insert
operation with ``ZONE_RESOURCE_POOL_EXHAUSTED`` (the capacity error is in the operation, not in
the insert's HTTP answer); a scripted fault of status 403 or 429 is the API's request-rate
limit, reason ``rateLimitExceeded`` ("Troubleshooting bulk instance creation").

Filters follow the ``filter`` parameter's reference (AIP-160 form): ``field = value`` or
``field != value`` (value quoted or bare), ``field:*`` (the key is set), several expressions
each in parentheses, joined by whitespace or ``AND`` and by ``OR``. A ``:`` substring match is
not in the reference (only ``:*`` is): the fake refuses it, as it refuses anything else it
cannot read, so a provider relying on it fails here.

Disks: an instance's boot disk (named after it, as GCP names it) is a record of its own; a
delete removes it when the disk is ``autoDelete``. A stopped instance (``TERMINATED``: the
guest powered off) keeps its disk and is billed for it ("Stop and start a compute instance").

References: https://cloud.google.com/compute/docs/reference/rest/v1/instances/insert (and
``…/instances/get``, ``/delete``, ``/aggregatedList``),
https://cloud.google.com/compute/docs/reference/rest/v1/zoneOperations/wait (returns DONE or
the current state after about 2 minutes) and ``…/zoneOperations/list``.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote_plus, urlparse

import responses

PROJECT = "spotopt-test"
CE = f"https://compute.googleapis.com/compute/v1/projects/{PROJECT}"
LINK = f"https://www.googleapis.com/compute/v1/projects/{PROJECT}"
"""Self links in answers name www.googleapis.com, as the real API's do."""
Reply = tuple[int, dict[str, str], str]


def _error(status: int, reason: str, message: str) -> Reply:
    body = {
        "error": {
            "code": status,
            "message": message,
            "errors": [{"message": message, "domain": "global", "reason": reason}],
        }
    }
    return status, {}, json.dumps(body)


def _not_found(path: str) -> Reply:
    return _error(404, "notFound", f"The resource 'projects/{PROJECT}/{path}' was not found")


def _path(item: dict[str, Any], dotted: str) -> str:
    value: Any = item
    for part in dotted.split("."):
        value = value.get(part, "") if isinstance(value, dict) else ""
    return str(value)


_EXPRESSION = re.compile(r'\s*([\w.-]+)\s*(!=|=|:)\s*("(?:[^"]*)"|[^\s()]+)\s*')


def _expression(text: str, item: dict[str, Any]) -> bool:
    term = _EXPRESSION.fullmatch(text)
    if term is None:
        raise AssertionError(f"the filter expression {text!r} is not in the documented syntax")
    field_name, op, value = term[1], term[2], term[3].strip('"')
    if op == ":":
        if value != "*":
            raise AssertionError(f"{text!r}: ':' is documented only as ':*', not as a substring match")
        return _path(item, field_name) != ""
    return (_path(item, field_name) == value) == (op == "=")


def filter_matches(flt: str, item: dict[str, Any]) -> bool:
    """The reference's filter syntax (module doc) over a JSON resource; AND binds before OR."""
    flt = flt.strip()
    if not flt:
        return True
    if not flt.startswith("("):
        return _expression(flt, item)
    groups: list[list[bool]] = [[]]
    for match in re.finditer(r"\(([^()]*)\)|\s+(AND|OR)\s+|\s+|(.)", flt):
        inner, joiner, stray = match[1], match[2], match[3]
        if stray is not None:
            raise AssertionError(f"the filter {flt!r} is not in the documented syntax")
        if inner is not None:
            groups[-1].append(_expression(inner, item))
        elif joiner == "OR":
            groups.append([])
    return any(all(group) for group in groups if group)


@dataclass
class GcpComputeFake:
    """Instances and operations of one project; register with ``install(rsps)``."""

    exhausted: set[str] = field(default_factory=set)
    """Zones whose inserts end with ZONE_RESOURCE_POOL_EXHAUSTED."""
    quota_exceeded: bool = False
    offers: dict[str, list[str]] = field(default_factory=dict)
    """Machine or accelerator type name → the zones that offer it."""
    ends_by_itself: Callable[[str], bool] = lambda script: False
    """A start-up script for which the VM's job ends at once (the guest shuts the VM down)."""
    instances: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    operations: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    requests: dict[str, str] = field(default_factory=dict)
    """requestId → operation name."""
    faults: list[int] = field(default_factory=list)
    """HTTP statuses the next requests answer (whatever they ask) before the fake serves again."""
    inserted: list[dict[str, Any]] = field(default_factory=list)
    """Every insert body received (first sight of a request id only)."""
    disks: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    """Boot disks by (zone, name); they outlive their instance unless ``autoDelete``."""
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1000))

    def calls(self, method: str, pattern: str) -> list[Any]:
        """The requests (with their responses) of ``method`` whose URL matches ``pattern``."""
        return [
            c
            for c in self.rsps.calls
            if c.request.method == method and re.search(pattern, unquote_plus(c.request.url))
        ]

    def install(self, rsps: responses.RequestsMock) -> None:
        self.rsps = rsps
        zone = r"/zones/(?P<zone>[a-z0-9-]+)"
        routes: list[tuple[str, str, Callable[..., Reply]]] = [
            ("POST", rf"{zone}/instances", self._insert),
            ("GET", rf"{zone}/instances/(?P<name>[a-z0-9-]+)", self._get),
            ("DELETE", rf"{zone}/instances/(?P<name>[a-z0-9-]+)", self._delete),
            ("POST", rf"{zone}/operations/(?P<op>[\w-]+)/wait", self._wait),
            ("GET", rf"{zone}/operations", self._list_operations),
            ("GET", r"/aggregated/instances", self._aggregated_instances),
            ("GET", r"/aggregated/(?P<kind>machineTypes|acceleratorTypes)", self._aggregated_types),
        ]
        for method, pattern, handler in routes:
            url = re.compile(re.escape(CE) + pattern + r"(\?.*)?$")
            rsps.add_callback(
                method, url, callback=self._route(url, handler), content_type="application/json"
            )

    def _route(self, url: re.Pattern[str], handler: Callable[..., Reply]) -> Callable[[Any], Reply]:
        def reply(request: Any) -> Reply:
            if self.faults:
                status = self.faults.pop(0)
                return _error(
                    status, "backendError" if status >= 500 else "rateLimitExceeded", "scripted fault"
                )  # 403/429 rateLimitExceeded: the request-rate limit (module doc)
            match = url.match(request.url)
            assert match is not None
            query = {k: v[0] for k, v in parse_qs(urlparse(request.url).query).items()}
            args = {k: v for k, v in match.groupdict().items() if v is not None and k != "0"}
            return handler(request, query, **args)

        return reply

    # -- what the cloud does by itself ---------------------------------------------------------

    def preempt(self, zone: str, name: str) -> None:
        """A Spot preemption: the operation, then the VM is deleted (with its auto-delete disk)
        under ``instanceTerminationAction=DELETE``, or stopped (disk kept) under ``STOP``."""
        self._operation(zone, name, "compute.instances.preempted", "DONE", user="system")
        vm = self.instances[(zone, name)]
        if vm.get("scheduling", {}).get("instanceTerminationAction") == "DELETE":
            self._remove(zone, name)
        else:
            vm["status"] = "TERMINATED"

    def power_off(self, zone: str, name: str) -> None:
        """The guest shut the VM down: ``TERMINATED`` (stopped), its disk kept and billed."""
        self.instances[(zone, name)]["status"] = "TERMINATED"

    def billing(self) -> list[str]:
        """What of ours still costs money: every instance that exists (a running one, a stopped
        one's disks and IP) and every disk (module doc)."""
        return [f"instance {z}/{n}" for z, n in self.instances] + [f"disk {z}/{n}" for z, n in self.disks]

    def _remove(self, zone: str, name: str) -> None:
        vm = self.instances.pop((zone, name))
        for disk in vm.get("disks", []):
            if disk.get("autoDelete"):
                self.disks.pop((zone, name), None)

    # -- handlers ------------------------------------------------------------------------------

    def _operation(self, zone: str, name: str, kind: str, status: str, **extra: Any) -> dict[str, Any]:
        number = next(self._ids)
        op = {
            "kind": "compute#operation",
            "id": str(number),
            "name": f"operation-{number}-{kind.rsplit('.', 1)[-1]}",
            "zone": f"{LINK}/zones/{zone}",
            "operationType": kind,
            "targetLink": f"{LINK}/zones/{zone}/instances/{name}",
            "status": status,
            "progress": 100 if status == "DONE" else 0,
            "insertTime": "2026-11-22T10:00:00.000-08:00",
            "user": "spotopt@spotopt-test.iam.gserviceaccount.com",
            **extra,
        }
        op["selfLink"] = f"{LINK}/zones/{zone}/operations/{op['name']}"
        self.operations[(zone, op["name"])] = op
        return op

    def _insert(self, request: Any, query: dict[str, str], zone: str) -> Reply:
        request_id = query.get("requestId", "")
        if request_id in self.requests:  # GCP ignores a request it has seen: the same operation
            return 200, {}, json.dumps(self.operations[(zone, self.requests[request_id])])
        body = json.loads(request.body)
        name = body["name"]
        if (zone, name) in self.instances:
            return _error(
                409,
                "alreadyExists",
                f"The resource 'projects/{PROJECT}/zones/{zone}/instances/{name}' already exists",
            )
        self.inserted.append(body)
        op = self._operation(zone, name, "insert", "PENDING")
        self.requests[request_id] = op["name"]
        if zone in self.exhausted or self.quota_exceeded:
            code = "QUOTA_EXCEEDED" if self.quota_exceeded else "ZONE_RESOURCE_POOL_EXHAUSTED"
            op["pending_error"] = {
                "errors": [
                    {
                        "code": code,
                        "message": f"The zone 'projects/{PROJECT}/zones/{zone}' does not have enough "
                        "resources available to fulfill the request.",
                    }
                ]
            }
            return 200, {}, json.dumps(op)
        number = next(self._ids)
        self.disks[(zone, name)] = {"name": name, "zone": f"{LINK}/zones/{zone}", "users": [name]}
        self.instances[(zone, name)] = {
            **body,
            "kind": "compute#instance",
            "id": str(number),
            "creationTimestamp": f"2026-11-22T10:{number % 60:02d}:00.000-08:00",
            "zone": f"{LINK}/zones/{zone}",
            "machineType": f"{LINK}/{body['machineType']}",
            "status": "PROVISIONING",
            "selfLink": f"{LINK}/zones/{zone}/instances/{name}",
        }
        return 200, {}, json.dumps(op)

    def _wait(self, request: Any, query: dict[str, str], zone: str, op: str) -> Reply:
        operation = self.operations.get((zone, op))
        if operation is None:
            return _not_found(f"zones/{zone}/operations/{op}")
        if operation["status"] != "DONE":
            operation.update(status="DONE", progress=100)
            if "pending_error" in operation:
                operation["error"] = operation.pop("pending_error")
                operation.update(httpErrorStatusCode=503, httpErrorMessage="SERVICE UNAVAILABLE")
            self._finish(zone, operation)
        return 200, {}, json.dumps(operation)

    def _finish(self, zone: str, op: dict[str, Any]) -> None:
        name = op["targetLink"].rsplit("/", 1)[-1]
        vm = self.instances.get((zone, name))
        if vm is None:
            return
        if op["operationType"] == "delete":
            self._remove(zone, name)
        elif op["operationType"] == "insert" and "error" not in op:
            script = {i["key"]: i["value"] for i in vm["metadata"]["items"]}.get("startup-script", "")
            vm["status"] = "TERMINATED" if self.ends_by_itself(script) else "RUNNING"

    def _get(self, request: Any, query: dict[str, str], zone: str, name: str) -> Reply:
        vm = self.instances.get((zone, name))
        if vm is None:
            return _not_found(f"zones/{zone}/instances/{name}")
        return 200, {}, json.dumps(vm)

    def _delete(self, request: Any, query: dict[str, str], zone: str, name: str) -> Reply:
        vm = self.instances.get((zone, name))
        if vm is None:
            return self._get(request, query, zone, name)
        vm["status"] = "STOPPING"
        return 200, {}, json.dumps(self._operation(zone, name, "delete", "RUNNING"))

    def _list_operations(self, request: Any, query: dict[str, str], zone: str) -> Reply:
        flt = query.get("filter", "")
        items = [op for (z, _), op in self.operations.items() if z == zone and filter_matches(flt, op)]
        return (
            200,
            {},
            json.dumps(
                {
                    "kind": "compute#operationList",
                    "id": f"projects/{PROJECT}/zones/{zone}/operations",
                    "items": items,
                    "selfLink": f"{LINK}/zones/{zone}/operations",
                }
            ),
        )

    def _aggregated_instances(self, request: Any, query: dict[str, str]) -> Reply:
        flt = query.get("filter", "")
        items: dict[str, Any] = {}
        for (zone, _), vm in sorted(self.instances.items()):
            if filter_matches(flt, vm):
                items.setdefault(f"zones/{zone}", {"instances": []})["instances"].append(vm)
        if not items:  # the real API names every zone; an empty one carries a warning
            items["zones/us-central1-a"] = {
                "warning": {
                    "code": "NO_RESULTS_ON_PAGE",
                    "message": "There are no results for scope 'zones/us-central1-a' on this page.",
                    "data": [{"key": "scope", "value": "zones/us-central1-a"}],
                }
            }
        return (
            200,
            {},
            json.dumps(
                {
                    "kind": "compute#instanceAggregatedList",
                    "id": f"projects/{PROJECT}/aggregated/instances",
                    "items": items,
                    "selfLink": f"{LINK}/aggregated/instances",
                }
            ),
        )

    def _aggregated_types(self, request: Any, query: dict[str, str], kind: str) -> Reply:
        wanted = re.fullmatch(r'name = "(.*)"', query.get("filter", ""))
        assert wanted is not None, "the provider asks for one type by name"
        items = {
            f"zones/{zone}": {kind: [{"kind": f"compute#{kind[:-1]}", "name": wanted[1], "zone": zone}]}
            for zone in self.offers.get(wanted[1], [])
        }
        return 200, {}, json.dumps({"kind": f"compute#{kind[:-1]}AggregatedList", "items": items})
