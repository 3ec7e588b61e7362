"""The package's shape: rendered sources against the record taken before the layout moved, module sizes, no import
cycles, no private names used from tests or tools, schedule files that load, validate and round-trip, README."""
import ast
import hashlib
import json
from pathlib import Path

import pytest

from qrgen.paths import schedule_dir
from qrgen.plan.planner import check, plan
from qrgen.problem import Problem
from qrgen.render.sources import render
from qrgen.schedule.files import find, load, read, to_document, tuner_params
from qrgen.schedule.heuristic import default_schedule
from qrgen.targets import Target
from qrgen.tune.space import schedule_from_params

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "qrgen"
DATA = ROOT / "tests" / "data"
MAX_LINES = 450


def _digests(schedule) -> dict:
    target, out = Target(), {}
    for keep in (False, True):
        try:
            kernels = plan(schedule, target, keep).kernels
        except ValueError:  # a schedule with no keep plan
            continue
        for spec in kernels:
            rendered = render(spec, schedule, target)
            out[("keep:" if keep else "") + rendered.name] = hashlib.sha256(rendered.source.encode()).hexdigest()
    return out


def _current_digests(record: dict) -> dict:
    result = {}
    for path in sorted(schedule_dir().glob("*/*.json")):
        result[f"committed:{path.relative_to(schedule_dir())}"] = _digests(load(path)[0])
    for batch, m, n in record["shapes"]:
        problem = Problem(m, n, batch)
        result[f"default:{batch}x{m}x{n}"] = _digests(default_schedule(problem))
        fp32, _ = find(problem, Target(), root=Path("/nonexistent"), precision="fp32")
        result[f"default:{batch}x{m}x{n}:fp32"] = _digests(fp32)
    return result


def test_rendered_sources_are_the_recorded_ones_or_a_listed_change():
    """Every kernel of every committed schedule and of the test shapes' defaults (plain and keep plans, as tuned
    and in fp32) renders to the source recorded at c9de681, before the layout moved, except the kernels that
    rendered_changes.json names with the reason their source changed (and each of those did change), the kernels
    it names as added to schedules (each added somewhere), the schedules it names as changed since and the committed
    files it names as deleted since."""
    record = json.loads((DATA / "rendered_c9de681.json").read_text())
    changes = json.loads((DATA / "rendered_changes.json").read_text())
    current = _current_digests(record)
    removed = {key for entry in changes["removed"] for key in entry["keys"]}
    assert removed <= set(record["digests"]) and all(key.startswith("committed:") for key in removed)
    assert set(current) == set(record["digests"]) - removed

    def renamed(name):  # the kernel's name now (renames: [old prefix, new prefix], or [old, new, "exact"])
        for old, new, *exact in changes["renames"]:
            base = name.removeprefix("keep:")
            name = name.replace(old, new, 1) if (base == old if exact else base.startswith(old)) else name
        return name

    changed, listed = set(), {name for entry in changes["changes"] for name in entry["kernels"]}
    rescheduled = {key for entry in changes["schedules"] for key in entry["keys"]}
    added = {name for entry in changes["added"] for name in entry["kernels"]}
    assert rescheduled <= set(record["digests"])
    seen_added = set()
    for key, kernels in record["digests"].items():
        if key in rescheduled or key in removed:
            continue
        kernels = {renamed(name): digest for name, digest in kernels.items()}
        new = {name for name in current[key] if name.removeprefix("keep:") in added} - set(kernels)
        seen_added |= {name.removeprefix("keep:") for name in new}
        assert set(current[key]) - new == set(kernels), key
        changed |= {name.removeprefix("keep:") for name, digest in kernels.items() if current[key][name] != digest}
    assert changed - listed == set(), "kernels whose source changed with no reason in rendered_changes.json"
    assert listed - changed == set(), "rendered_changes.json lists kernels whose source did not change"
    assert added == seen_added, "rendered_changes.json lists added kernels that no compared schedule gained"


def _modules():
    return sorted(PACKAGE.rglob("*.py"))


def _name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_module_is_long():
    long = {str(p.relative_to(ROOT)): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def _imports(path: Path, known: set) -> set:
    """The package's modules a module imports, at its top or inside functions."""
    name = _name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                if sub in known:
                    out.add(sub)
                elif module in known:
                    out.add(module)
    out.discard(name)
    return out


def test_no_import_cycles():
    known = {_name(p) for p in _modules()}
    graph = {_name(p): _imports(p, known) for p in _modules()}
    state, stack, cycles = {}, [], []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert cycles == []


def _private_uses(path: Path) -> list:
    tree = ast.parse(path.read_text())
    modules, found = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("qrgen"):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{path.name}:{node.lineno} imports {alias.name}")
                modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            modules |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("qrgen")}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name) and node.value.id in modules):
            found.append(f"{path.name}:{node.lineno} uses {node.value.id}.{node.attr}")
    return found


def test_tests_and_tools_use_no_private_names():
    files = sorted((ROOT / "tests").rglob("*.py")) + sorted((ROOT / "tools").rglob("*.py"))
    assert [use for path in files for use in _private_uses(path)] == []


@pytest.mark.parametrize("path", sorted(schedule_dir().glob("*/*.json")), ids=lambda p: p.name)
def test_committed_schedule_files_load_validate_and_round_trip(path):
    data = json.loads(path.read_text())
    assert data["format"] == 2
    schedule, provenance = load(path)
    target = Target(data["backend"], data["arch"])
    check(schedule, target)  # the target can run it
    problem = Problem(schedule.m, schedule.n, data["batch"])
    assert to_document(schedule, problem, target, provenance) == data == read(path)
    params = tuner_params(provenance)
    if params is not None:  # a tuner point not marked stale describes the file's schedule
        assert schedule_from_params(problem, params) == schedule
    assert provenance.get("amendments") is None or provenance["tuner"]["stale"]


def test_readme_is_short_and_starts_with_set_up_and_test():
    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) <= 12 * 1024
    first = text.split("\n## ")[1]  # the first section
    assert first.startswith("Set up and test")
    assert 'python3 -m pip install -e ".[cuda,test]"' in first and "python3 -m pytest -q" in first


def test_planner_refuses_what_the_target_lacks_and_the_heuristic_picks_for_its_target():
    """A cluster panel on an arch without clusters is refused, naming the feature; the default schedule for such an
    arch has no cluster panels, and its register and shared-memory budgets are the arch's."""
    from qrgen.schedule.model import Panel, Schedule

    clustered = Schedule(2048, 32, (Panel(32, "lanes", 256, 8, cluster=True),))
    check(clustered, Target("cuda", "sm_90"))
    with pytest.raises(ValueError, match="clusters"):
        check(clustered, Target("cuda", "sm_80"))
    problem = Problem(2048, 2048, 8)
    assert any(p.cluster for p in default_schedule(problem, Target("cuda", "sm_90")).panels)
    ampere = default_schedule(problem, Target("cuda", "sm_80"))
    assert not any(p.cluster for p in ampere.panels)
    check(ampere, Target("cuda", "sm_80"))
    assert Target("cuda", "sm_89").limits.shared_bytes < Target("cuda", "sm_90").limits.shared_bytes


def test_fused_launches_take_clusters_only_where_the_target_has_them():
    from qrgen.plan import fused
    from qrgen.schedule.model import Panel, Schedule

    schedule = Schedule(1024, 64, (Panel(32, "rows", 256),) * 2, panel_update="fused")
    assert {k.blocks for k in plan(schedule, Target("cuda", "sm_90")).kernels if k.variant == "fused"} == {1, 2, 4, 8}
    assert {k.blocks for k in plan(schedule, Target("cuda", "sm_80")).kernels if k.variant == "fused"} == {1}
    assert fused.cluster(2, 32, 1024, 132, fused.cluster_sizes(Target("cuda", "sm_80"))) == 1
    assert fused.cluster(2, 32, 1024, 132, fused.cluster_sizes(Target("cuda", "sm_90"))) > 1


def test_every_cited_decision_exists():
    """Code and templates cite measured defaults as docs/decisions.md#<id>: each id is an entry's heading."""
    import re

    ids = set(re.findall(r"^## (\S+)", (ROOT / "docs" / "decisions.md").read_text(), re.M))
    files = [*PACKAGE.rglob("*.py"), *(ROOT / "templates").rglob("*.*")]
    cited = {(p.name, c) for p in files for c in re.findall(r"decisions\.md#([a-z0-9-]+)", p.read_text())}
    assert cited and {(name, c) for name, c in cited if c not in ids} == set()
