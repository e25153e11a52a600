"""Parse kvgate's /metrics text (stdin) with Prometheus' own Python parser,
and check that every family is described and that no label is called
`instance` (Prometheus renames it to `exported_instance`). Prints the family
names, one a line, after "ok"."""
import sys

from prometheus_client.parser import text_string_to_metric_families

text = sys.stdin.read()
names = []
for family in text_string_to_metric_families(text):
    assert family.documentation, f"{family.name} has no # HELP"
    for sample in family.samples:
        assert "instance" not in sample.labels, sample
    names.append(family.name)
assert names, "no families"
print("ok")
print("\n".join(names))
