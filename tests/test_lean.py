"""edge.app.lean: what `qledge serve` keeps out of the daemon before anything else loads, and
that what it defers still works at first use. Each case runs in a fresh interpreter, since
the point is what a process has imported."""

from __future__ import annotations

import json
import subprocess
import sys

DEFERRED = ["msgspec._json_schema", "msgspec.inspect", "msgspec.toml", "msgspec.yaml"]


def _fresh(code: str) -> dict:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


PREFIX = f"""
import json, sys
from edge.app.lean import import_msgspec
import_msgspec()
import msgspec
def loaded():
    return sorted(m for m in sys.modules if m in {DEFERRED!r})
"""


def test_msgspec_comes_without_its_type_descriptions_and_they_load_at_first_use():
    out = _fresh(PREFIX + """
idle = loaded()
class Point(msgspec.Struct):
    x: int
wire = msgspec.msgpack.decode(msgspec.msgpack.encode(Point(1)), type=Point)
stored = msgspec.json.decode(msgspec.json.encode(wire), type=Point)
before_schema = loaded()
schema = msgspec.json.schema(Point)
components = msgspec.json.schema_components([Point])[1]
info = type(msgspec.inspect.type_info(Point)).__name__
from msgspec import toml, yaml
import msgspec.inspect as mi
print(json.dumps({"idle": idle, "before_schema": before_schema, "after": loaded(), "schema": schema,
                  "components": sorted(components), "info": info, "same": mi is msgspec.inspect,
                  "toml": toml.__name__, "yaml": yaml.__name__, "x": stored.x,
                  "typing_extensions": "absent" if "typing_extensions" not in sys.modules else
                  getattr(sys.modules["typing_extensions"], "__name__", None)}))
""")
    assert out["idle"] == [] and out["before_schema"] == []  # JSON itself needs none of them
    assert out["x"] == 1
    assert out["schema"]["$ref"] == "#/$defs/Point" and out["components"] == ["Point"]
    assert out["info"] == "StructType" and out["same"] is True
    assert (out["toml"], out["yaml"]) == ("msgspec.toml", "msgspec.yaml")
    assert out["after"] == DEFERRED
    assert out["typing_extensions"] == "absent"  # kept out of msgspec: typing has all it needs


def test_typing_extensions_is_kept_out_of_msgspec_only():
    """psycopg (cluster mode) imports typing_extensions after msgspec: it must still find it."""
    out = _fresh(PREFIX + """
import importlib.util
installed = importlib.util.find_spec("typing_extensions") is not None
if installed:
    import typing_extensions
print(json.dumps({"installed": installed, "loaded": "typing_extensions" in sys.modules,
                  "used_by_msgspec": sys.modules["msgspec._utils"]._get_type_hints.__module__}))
""")
    assert out["installed"], "the test environment has typing_extensions (the MCP SDK needs it)"
    assert out["loaded"] and out["used_by_msgspec"] == "typing"


def test_an_unknown_attribute_of_msgspec_is_still_an_attribute_error():
    out = _fresh(PREFIX + """
try:
    msgspec.nope
except AttributeError as exc:
    print(json.dumps({"error": str(exc), "loaded": loaded()}))
""")
    assert out == {"error": "module 'msgspec' has no attribute 'nope'", "loaded": []}


def test_after_msgspec_is_imported_it_changes_nothing():
    out = _fresh("""
import json, sys
import msgspec
from edge.app.lean import import_msgspec
import_msgspec()
print(json.dumps({"inspect": "msgspec.inspect" in sys.modules, "getattr": "__getattr__" in vars(msgspec)}))
""")
    assert out == {"inspect": True, "getattr": False}
