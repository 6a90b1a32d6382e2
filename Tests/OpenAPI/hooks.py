"""schemathesis hooks of the `make test` run (Tests/OpenAPI/schemathesis.toml).

`filter_case` leaves out of the run exactly the inputs of a known server bug whose fix is in
progress elsewhere, so that the run holds the server to everything else: delete its test
together with the bug. `map_case` keeps long-polls short, so that the run fits in CI.
"""

import json
import re

import schemathesis

# KNOWN ISSUE (JSON layer, being rewritten: Sources/TrunkSync/JSON/Timestamp.swift): an RFC
# 3339 timestamp with 7 to 9 fraction digits, which the description (and the README) allow,
# crashes the whole server: `RFC3339.parse` builds the range `digits..<6` with digits > 6
# ("Range requires lowerBound <= upperBound"). It is reached by `client_timestamp` of a
# push or a REST insert and by every REST filter on a timestamp column.
LONG_FRACTION = re.compile(r"[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{7}")


def _text(value):
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8", "replace")
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)


@schemathesis.hook
def filter_case(context, case):
    parts = [case.query, case.body, case.path_parameters, case.headers]
    return not any(LONG_FRACTION.search(_text(part)) for part in parts if part is not None)


@schemathesis.hook
def map_case(context, case):
    # `wait` (0–60) holds an empty pull that long: at most 1 s here. Values out of range
    # or not integers are left alone (they get `400` at once).
    if case.operation.method.upper() == "GET" and case.operation.path == "/sync/v1/events" and case.query:
        wait = case.query.get("wait")
        if isinstance(wait, (int, str)) and not isinstance(wait, bool) and str(wait).isdigit() and 1 < int(wait) <= 60:
            case.query["wait"] = 1
    return case
