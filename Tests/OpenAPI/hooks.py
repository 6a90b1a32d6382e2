"""schemathesis hooks of the `make test` run (Tests/OpenAPI/schemathesis.toml).

`map_case` keeps long-polls short, so that the run fits in CI. No input is left out.
"""

import schemathesis


@schemathesis.hook
def map_case(context, case):
    # `wait` (0–60) holds an empty pull that long: at most 1 s here. Values out of range
    # or not integers are left alone (they get `400` at once).
    if case.operation.method.upper() == "GET" and case.operation.path == "/sync/v1/events" and case.query:
        wait = case.query.get("wait")
        if isinstance(wait, (int, str)) and not isinstance(wait, bool) and str(wait).isdigit() and 1 < int(wait) <= 60:
            case.query["wait"] = 1
    return case
