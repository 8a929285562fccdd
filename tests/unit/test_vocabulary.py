"""Unit layer: one vocabulary, one error base, and an embedded mode that never loads the Kubernetes client."""

from __future__ import annotations

import ast
import subprocess
import sys

from gpufn_dagster import errors
from gpufn_dagster.tags import (CARRY_COMMIT_MESSAGE, COMMIT_PREFIX, DAGSTER_PRIORITY_TAG, LANCE_PREFIX, PREFIX,
                                REFRESH_COMMIT_PREFIX, SOURCE_VERSION_KEY, TABLE_VERSION_BEFORE_KEY, CapacityReason,
                                CapacityState)

from ..conftest import REPO

PACKAGE = REPO / "gpufn_dagster"
README = (REPO / "README.md").read_text()


def _sources():
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_gpufn_key_is_spelled_in_the_tags_module_only():
    """Tags and metadata keys (`gpufn/`), Lance metadata keys and Kubernetes labels (`gpufn.`), the
    refresh's commit message and Dagster's priority tag: written in tags.py, imported everywhere else."""
    spelled = {}
    owned = (PREFIX, LANCE_PREFIX, REFRESH_COMMIT_PREFIX, CARRY_COMMIT_MESSAGE, DAGSTER_PRIORITY_TAG,
             TABLE_VERSION_BEFORE_KEY, SOURCE_VERSION_KEY)
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(owned):
                spelled.setdefault(node.value, set()).add(path.relative_to(REPO).as_posix())
    outside = {key: files for key, files in spelled.items() if files != {"gpufn_dagster/tags.py"}}
    # Doctest examples are text, not code: they show the keys as a user sees them.
    assert outside == {}, outside
    assert {LANCE_PREFIX, DAGSTER_PRIORITY_TAG} <= set(spelled)  # the check sees them
    # Every commit gpufn writes starts with the prefix the table sensor skips on.
    assert REFRESH_COMMIT_PREFIX.startswith(COMMIT_PREFIX) and CARRY_COMMIT_MESSAGE.startswith(COMMIT_PREFIX)


def test_the_lance_keys_a_refresh_writes_are_the_vocabularys(tmp_path):
    import lance
    import pyarrow as pa

    from gpufn_dagster import make_function, refresh_column
    from gpufn_dagster.tags import FUNCTION_KEY, SIG_COLUMN_KEY
    from gpufn_dagster.assets.changed_partitions import changed_data, operations_since

    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.table({"x": [1, 2]}), uri)
    function = make_function(_double, table="t", column="y")
    refresh_column(uri, function)
    metadata = lance.dataset(uri).schema.field("y").metadata
    assert metadata[SIG_COLUMN_KEY.encode()].decode() == function.sig_column
    assert metadata[FUNCTION_KEY.encode()].decode() == function.name
    operations = operations_since(lance.dataset(uri), 1)
    (message,) = [m for op, m in operations if op == "DataReplacement"]
    assert message.startswith(REFRESH_COMMIT_PREFIX) and function.name in message and function.version in message
    assert not changed_data(operations)  # the table sensor sees no new or changed rows in it


def _double(x: int) -> int:
    return 2 * x


def test_every_capacity_state_and_reason_a_tag_takes_is_in_the_readme():
    written = [s for s in CapacityState if s is not CapacityState.PENDING]
    assert {s.value for s in written} >= {"running", "timed-out", "waiting", "scheduled", "never-fits"}
    missing = [s.value for s in written if f"`{s.value}`" not in README]
    assert missing == [], f"README does not list capacity states {missing}"
    missing = [r.value for r in CapacityReason if f"`{r.value}`" not in README]
    assert missing == [], f"README does not list capacity reasons {missing}"
    assert all(r.value[0].isupper() and r.value.isalnum() for r in CapacityReason)


def test_kueue_states_and_placement_kinds_are_closed_words_the_readme_lists():
    from gpufn_dagster.tags import PLACEMENT_REJECTED, KueueState, RunKind

    missing = [w for w in [*(k.value for k in KueueState), *(k.value for k in RunKind), PLACEMENT_REJECTED]
               if f"`{w}`" not in README]
    assert missing == [], f"README does not list {missing}"


def test_every_verdict_and_decision_takes_its_words_from_the_vocabulary():
    """A verdict's reason and a Kueue state are written as tags: no module spells one as a literal."""
    literals = []
    kueue_words = {"pending", "quota-reserved", "admitted", "preempted", "evicted", "finished"}
    for path in (PACKAGE / "run").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Verdict" and len(node.args) > 1 \
                    and isinstance(node.args[1], ast.Constant):
                literals.append(f"{path.name}:{node.lineno} Verdict reason {node.args[1].value!r}")
            if isinstance(node, ast.Compare) and any(isinstance(c, ast.Constant) and c.value in kueue_words
                                                     for c in node.comparators):
                literals.append(f"{path.name}:{node.lineno} compares with a Kueue state literal")
    assert literals == []


def test_function_ops_carry_the_gpu_request_and_no_pod_placement():
    """The pod's placement is decided when a run launches, so no op tag may freeze it at load."""
    import dagster as dg
    from dagster_k8s.job import USER_DEFINED_K8S_CONFIG_KEY

    from gpufn_dagster import gpu_function

    @gpu_function(table="docs", column="n", output_type="int64", gpu_class="l4")
    def n(text: str) -> int:
        return len(text)

    @gpu_function(table="docs", column="m", output_type="int64", gpu_class="l4", workers=2)
    def m(text: str) -> int:
        return len(text)

    ops = [n.op, *m.node_def.node_defs] if isinstance(m.node_def, dg.GraphDefinition) else [n.op]
    assert len(ops) == 4
    assert all(USER_DEFINED_K8S_CONFIG_KEY not in op.tags for op in ops), [op.tags for op in ops]
    assert n.op.tags["gpufn/gpu-class"] == "l4" and n.op.tags["gpufn/gpu-count"] == "1"


def test_every_error_the_package_defines_is_a_gpufn_error_from_the_errors_module():
    defined_elsewhere = []
    for path in _sources():
        if path.name == "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    getattr(b, "id", getattr(b, "attr", "")).endswith(("Error", "Exception")) for b in node.bases):
                defined_elsewhere.append(f"{path.name}:{node.name}")
    assert defined_elsewhere == []
    classes = [v for v in vars(errors).values() if isinstance(v, type) and issubclass(v, Exception)]
    assert len(classes) > 10 and all(issubclass(c, errors.GpufnError) for c in classes)


def test_embedded_mode_never_imports_the_kubernetes_client():
    code = ("import sys, gpufn_dagster, gpufn_dagster.embedded.coordinator, gpufn_dagster.components, gpufn_dagster.assets.triggers, "
            "gpufn_dagster.assets.checks, gpufn_dagster.cli\n"
            "import docs_pipeline.udfs\n"
            "print(sorted(m for m in ('kubernetes', 'dagster_k8s', 'gpufn_devcluster', 'cryptography') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
    # ...while the Kubernetes path does load it (so the check above can fail).
    out = subprocess.run([sys.executable, "-c", "import sys; from gpufn_dagster import GpuK8sRunLauncher; print('dagster_k8s' in sys.modules)"],
                         capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "True"


def test_gpufn_bookkeeping_tags_are_hidden_by_dagsters_own_rule_and_a_run_shows_only_what_users_filter_by():
    from dagster._core.storage.tags import HIDDEN_TAG_PREFIX, PRIORITY_TAG, TagType, get_tag_type

    from gpufn_dagster import tags

    assert tags.HIDDEN_PREFIX.startswith(HIDDEN_TAG_PREFIX)
    from dagster._utils.tags import is_valid_tag_key

    keys = [v for n, v in vars(tags).items() if n.endswith("_TAG") and isinstance(v, str)]
    assert [k for k in keys if not is_valid_tag_key(k)] == []  # no key Dagster warns of (or will refuse)
    assert tags.DAGSTER_PRIORITY_TAG == PRIORITY_TAG  # Dagster's own, read, never written by gpufn
    run_tags = {value for name, value in vars(tags).items() if name.endswith("_TAG") and isinstance(value, str)
                and value != PRIORITY_TAG}
    shown = {t for t in run_tags if get_tag_type(t) is not TagType.HIDDEN}
    # What a user filters runs by; GPU_COUNT_TAG and SHARD_TAG are op tags (runs carry RUN_GPU_COUNT_TAG),
    # GOT_CLASS_TAG only on runs whose Functions accept several classes.
    assert shown == {tags.GPU_CLASS_TAG, tags.CAPACITY_TAG, tags.PLACEMENT_TAG, tags.GPU_COUNT_TAG, tags.SHARD_TAG,
                     tags.GOT_CLASS_TAG}
    assert get_tag_type(tags.RUN_GPU_COUNT_TAG) is TagType.HIDDEN
