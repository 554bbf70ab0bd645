"""The README and the docs site: the site builds with `mkdocs build --strict` (a broken link, a
missing page or an unresolvable API identifier fails), the committed configuration reference is what
the code renders (its generator: tests/test_config_reference.py), the README stays short, its links
resolve, and every shell command in its ```bash blocks is run, verbatim, by some test (or is marked as
one that cannot run here)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import doc_commands
import pytest
import yaml
from test_config_reference import leaf_fields, reference_rows
from test_pipeline_ray import SMALL, small

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
README_MAX_LINES = 200

# Every command line of README.md's ```bash blocks -> the test that runs it verbatim from the
# repository root (overrides appended that keep it to a step are fine), or CI. A command added to the
# README without an entry here fails test_every_readme_command_is_run; an entry whose command left
# the README fails too.
RUN_BY = {
    "bash scripts/train.sh": "CI: the job that trains the default from a bare clone",
    "bash scripts/test.sh": "CI: the job that runs this test suite from a bare clone",
    "roll-train --config configs/ppo.yaml": "tests/test_docs.py::test_readme_demo_command_runs_and_draws_its_curves",
    "python -m examples.byo.build outputs/byo --overwrite": "tests/test_byo_pipeline.py::test_build_then_sft_then_grpo_with_the_math_reward",
    "roll-train --config examples/byo/sft.yaml": "tests/test_byo_pipeline.py::test_build_then_sft_then_grpo_with_the_math_reward",
    "roll-train --config examples/byo/grpo.yaml": "tests/test_byo_pipeline.py::test_build_then_sft_then_grpo_with_the_math_reward",
    "roll-check-loss examples.custom_loss.pipeline:capped_loss": "tests/test_user_imports.py::test_readme_check_loss_command_passes_from_the_repo_root",
    "roll-train --config examples/custom_loss/config.yaml": "tests/test_user_imports.py::test_readme_training_command_runs_from_the_repo_root",
}
# The README's blocks marked `<!-- not run here: ... -->`, by their first command: the only ones allowed
# (none: the GPU commands and the Ray recipe are in docs/gpus-and-clusters.md).
NOT_RUN: dict[str, str] = {}


def readme_bash_blocks() -> list[doc_commands.Block]:
    return doc_commands.blocks([REPO / "README.md"], lang="bash")


# ---- the site ----------------------------------------------------------------------------------------


def test_mkdocs_build_strict(tmp_path):
    site = tmp_path / "site"
    result = subprocess.run(
        [str(BIN / "mkdocs"), "build", "--strict", "--site-dir", str(site)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    reference = (site / "configuration" / "index.html").read_text()
    assert "rollout.max_new_tokens" in reference
    api = (site / "api" / "index.html").read_text()
    assert "agg_loss" in api and "DataProto" in api and "loss_func" in api


def linked_pages(markdown: str) -> set[str]:
    return set(re.findall(r"\]\(([\w/-]+\.md)(?:#[^)]*)?\)", markdown))


def test_every_page_is_in_the_nav_the_home_page_and_the_quickstarts_what_next():
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]
    listed = {next(iter(entry.values())) for entry in nav}
    pages = {path.relative_to(REPO / "docs").as_posix() for path in (REPO / "docs").rglob("*.md")}
    assert listed == pages
    home = linked_pages((REPO / "docs/index.md").read_text())
    assert not pages - home - {"index.md"}, f"docs/index.md does not link {sorted(pages - home - {'index.md'})}"
    what_next = linked_pages((REPO / "docs/quickstart.md").read_text().split("\n## What next\n")[1])
    unlisted = sorted(pages - what_next - {"index.md", "quickstart.md"})
    assert not unlisted, f"docs/quickstart.md's What next does not link {unlisted}"


# ---- the configuration reference ---------------------------------------------------------------------


def test_the_committed_configuration_reference_is_what_the_code_renders_and_every_key_is_explained():
    """docs/configuration.md reads on a code host without building the site; regenerate it with
    `python -m roll_lite.config.reference > docs/configuration.md` after changing a config dataclass."""
    from roll_lite.config.reference import render

    rendered = render()
    assert (REPO / "docs/configuration.md").read_text() == rendered + "\n", (
        "docs/configuration.md is stale: python -m roll_lite.config.reference > docs/configuration.md"
    )
    unexplained = [key for key, (_, _, comment) in reference_rows(rendered).items() if not comment.strip()]
    assert not unexplained, f"config keys without a comment in their dataclass: {unexplained}"


def test_a_comment_block_shared_by_keys_names_each_of_them():
    """A block comment above a field also explains the fields right after it that have none: it must
    name each of them (algorithm.value_clip and loss_agg_mode once sat under check_loss's block, and the
    reference explained them as the loss checker)."""
    from roll_lite.config.reference import field_comments, sections

    unnamed = set()
    for section in sections():
        keys = {key.name.rsplit(".", 1)[-1] for key in section.keys}  # a nested section has its docstring
        comments = {name: text for name, text in field_comments(section.cls).items() if name in keys}
        for name, comment in comments.items():
            sharing = [other for other, text in comments.items() if other != name and text.startswith(comment)]
            unnamed |= {
                f"{section.prefix}.{key}".lstrip(".")
                for key in (name, *sharing)
                if sharing and not re.search(rf"(?<![\w.]){key}(?!\w)", comment)
            }
    assert not unnamed, f"keys that share a comment block that does not name them: {sorted(unnamed)}"


# ---- the README ---------------------------------------------------------------------------------------


def test_readme_is_short():
    lines = len((REPO / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail into docs/"


def test_readme_links_resolve():
    text = (REPO / "README.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    assert local, "the README links into docs/"
    assert not [link for link in local if not (REPO / link).exists()]


REPO_PATH = re.compile(
    r"(?<![\w~/.$-])(?:docs|examples|configs|tests|benchmarks|scripts|roll_lite|pipelines|workers|data|\.ci)/[\w./-]*[\w/]"
)
IN_OTHER_REPOSITORIES = {
    "examples/data_preprocess/gsm8k.py": "verl",  # a path in verl's repository, said so where named
    "configs/ppo.yml": "did you mean",  # the near miss that roll-train's error line corrects (troubleshooting)
}


def test_every_path_the_docs_configs_and_examples_name_exists():
    """Each repository path named in the README, the contributor notes, docs/, configs/ and examples/
    exists (examples/byo/grpo.yaml once sent readers to an examples/byo/README that never was)."""
    files = [
        REPO / "README.md",
        REPO / "CONTRIBUTING.md",
        REPO / "CHANGELOG.md",
        *sorted((REPO / "docs").glob("*.md")),
        *sorted((REPO / "configs").glob("*.yaml")),
        *sorted(p for p in (REPO / "examples").rglob("*") if p.suffix in (".yaml", ".py", ".sh", ".md")),
    ]
    missing = []
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            for ref in (match.rstrip("/.") for match in REPO_PATH.findall(line)):
                other = IN_OTHER_REPOSITORIES.get(ref)
                if not (REPO / ref).exists() and (other is None or other not in line):
                    missing.append(f"{path.relative_to(REPO)}:{number}: {ref}")
    assert not missing, "\n".join(missing)


def test_every_readme_command_is_run():
    not_run, unclaimed, lines = {}, [], []
    for block in readme_bash_blocks():
        commands = doc_commands.command_lines(block.body)
        if block.not_run is not None:
            not_run[commands[0]] = block.not_run
        else:
            lines += commands
    assert not_run == NOT_RUN, "only these README blocks may be marked `<!-- not run here: ... -->`"
    unclaimed = [line for line in lines if line not in RUN_BY]
    assert not unclaimed, f"README commands no test runs (add a test and list it in RUN_BY): {unclaimed}"
    stale = sorted(set(RUN_BY) - set(lines))
    assert not stale, f"RUN_BY lists commands the README no longer shows: {stale}"
    for line, runner in RUN_BY.items():
        if runner.startswith("CI:"):
            assert shlex.split(line)[:2] in (["bash", "scripts/train.sh"], ["bash", "scripts/test.sh"]), line
            continue
        path, name = runner.split("::")
        source = (REPO / path).read_text()
        assert f"def {name}(" in source, f"{runner} (for `{line}`) does not exist"
        assert "doc_commands" in source, f"{path} must read `{line}` from the docs (tests/doc_commands.py)"


def test_the_custom_loss_snippet_is_written_once():
    found = doc_commands.python_blocks_defining("my_loss")
    assert [block.path for block in found] == ["docs/custom-losses.md"]  # the README links to it
    # tests/test_invariance.py puts it through the checker, test_policy_losses.py through the loss check


def test_the_custom_losses_pages_subclass_is_the_examples_code():
    """The page quotes examples/custom_loss's pipeline: the quote passes what the example passes (an
    abridged one once dropped the rollout_is arguments, and stopped a run with algorithm.rollout_is set)."""
    quoted = [block for block in doc_commands.blocks(lang="python") if "class CappedAdvantagePipeline(" in block.body]
    assert [block.path for block in quoted] == ["docs/custom-losses.md"]
    assert quoted[0].body.strip() in (REPO / "examples/custom_loss/pipeline.py").read_text()


def quickstart_log_patterns() -> list[re.Pattern]:
    """The log lines docs/quickstart.md shows, as patterns: any number, any run directory, `...` anything.
    The warm start's lines are left out (the demo test runs none)."""
    patterns = []
    for block in doc_commands.blocks([REPO / "docs/quickstart.md"], lang=""):
        for line in block.body.splitlines():
            if re.match(r"\d\d:\d\d:\d\d ", line) and "sft step" not in line:
                message = re.escape(line[9:]).replace(re.escape("..."), ".*")
                message = re.sub(r"outputs/\S+?(?=\\ |;|$)", r"\\S+", message)
                patterns.append(re.compile(re.sub(r"\d+(\\\.\d+)?", r"[-+.\\de]+", message)))
    return patterns


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> dict:
    """The README's demo command verbatim, from the repository root, with overrides appended that keep it
    to two tiny steps; its output (stdout and stderr) goes into one file, as a user's `> log 2>&1` would.
    Two tests read this one run: what the docs promise, and what a log file holds."""
    output = tmp_path_factory.mktemp("demo")
    line = "roll-train --config configs/ppo.yaml"
    assert line in doc_commands.command_lines("\n".join(block.body for block in readme_bash_blocks()))
    two_steps = [*SMALL, "steps=2", "eval_every=2", "wandb_mode=disabled"]
    argv = [str(BIN / "roll-train"), *shlex.split(line)[1:], *two_steps, f"output_dir={output}", "run_name=demo"]
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(RAY_AUTH_MODE="disabled", PYTHONUNBUFFERED="1")  # no line of stdout cut by a buffer's flush
    log = output / "roll_train.log"
    with log.open("w") as into:
        start = time.monotonic()
        process = subprocess.Popen(argv, cwd=REPO, stdout=into, stderr=subprocess.STDOUT, env=env)
        first_step = None
        while process.poll() is None:
            if first_step is None and "step 1/2 |" in log.read_text(errors="replace"):
                first_step = time.monotonic() - start
            time.sleep(0.05)
    text = log.read_text()
    assert process.returncode == 0, text[-3000:]
    return dict(text=text, run_dir=output / "demo", first_step=first_step, seconds=time.monotonic() - start)


def test_readme_demo_command_runs_and_draws_its_curves(demo):
    # The README then sends the reader to outputs/<run_name>/curves.svg, and the quickstart shows the log
    # lines a reader should see.
    curves = (demo["run_dir"] / "curves.svg").read_text()
    assert all(f">{name}</text>" in curves for name in ("reward/mean", "eval/reward_mean", "actor/kl")), curves[:500]
    assert "advantage: gae" in (demo["run_dir"] / "config.yaml").read_text()
    patterns = quickstart_log_patterns()
    assert len(patterns) >= 8
    printed = [line[9:] for line in demo["text"].splitlines() if re.match(r"\d\d:\d\d:\d\d ", line)]
    # the tiny run's model gets some steps' rewards all equal, which those lines say at their end
    # (docs/checkpoints.md#progress); the quickstart's warm-started run had a signal in every step it shows
    printed += [re.sub(r" \| all \d+ groups had equal rewards.*", "", line) for line in printed]
    unseen = [p.pattern for p in patterns if not any(p.fullmatch(line) for line in printed)]
    assert not unseen, f"docs/quickstart.md shows log lines the demo no longer prints: {unseen}\n" + "\n".join(printed)


def test_the_demo_into_a_file_writes_no_ansi_codes_and_counts_all_its_time(demo):
    """The demo runs in one process (workers.backend=auto chose local, and says so): no coloured
    `(ModelWorker pid=...)` prefix from Ray (tests/test_progress.py: Ray's colours taken out; the bars
    themselves). "N s in all" counts from the process start: at least the time until the first step, the
    workers' start included."""
    text = demo["text"]
    assert "workers.backend=auto → local" in text and "(ModelWorker" not in text
    assert "\x1b[" not in text, [line for line in text.splitlines() if "\x1b[" in line][:3]
    in_all = float(re.search(r"; ([0-9.]+) s in all; run dir", text).group(1))
    assert demo["first_step"] is not None and in_all >= demo["first_step"], (in_all, demo["first_step"])
    assert in_all <= demo["seconds"]


def test_the_docs_custom_loss_trains_through_roll_train_at_another_temperature(tmp_path):
    """docs/custom-losses.md's my_loss as written, through roll-train from the folder that holds it,
    sampling at rollout.temperature=0.7. It reports the engine-vs-actor gap that rollout.max_logp_gap checks
    (the documented loss once reported none, and every run stopped after step 1), and the actor's log-probs are
    taken at the sampling temperature: the gap is float32 noise, not the tenths of two temperatures."""
    (tmp_path / "readme_loss.py").write_text(doc_commands.python_blocks_defining("my_loss")[0].body)
    argv = [
        str(BIN / "roll-train"),
        "--config",
        str(REPO / "configs/grpo.yaml"),
        *small(tmp_path),  # 200 of the demo's rows, 8 eval prompts
        "algorithm.policy_loss=readme_loss:my_loss",
        "rollout.temperature=0.7",
        "steps=1",
        "eval_every=1",
        "save_model=false",
        "wandb_mode=disabled",
        f"output_dir={tmp_path}",
        "run_name=readme_loss",
        # one process, no Ray: the same run (Ray's workers importing from the cwd: tests/test_user_imports.py)
        "workers.backend=local",
    ]
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run(
        argv, cwd=tmp_path, capture_output=True, text=True, timeout=600, env={**env, "RAY_AUTH_MODE": "disabled"}
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "loss check: loss_func passed" in result.stderr
    step = [json.loads(line) for line in (tmp_path / "readme_loss" / "metrics.jsonl").read_text().splitlines()][-1]
    assert step["step"] == 1 and "actor/pg_loss" in step
    assert step["actor/rollout_logp_gap"] < 1e-4, step["actor/rollout_logp_gap"]


def config_keys() -> set[str]:
    from roll_lite.config import RunConfig

    return {key for key, *_ in leaf_fields(RunConfig())}


def dotted_keys_named(page: str, keys: set[str]) -> set[str]:
    """The `section.key` names in a page's `code` spans, outside its code blocks (what looks like one of
    ours, real or not)."""
    sections = "|".join(sorted({key.split(".")[0] for key in keys if "." in key}))
    return {
        m
        for code in re.findall(r"`([^`]+)`", re.sub(r"^```.*?^```", "", page, flags=re.S | re.M))
        for m in re.findall(rf"(?<![\w./-])((?:{sections})\.[a-z_][a-z_0-9.]*[a-z_0-9])(?![\w(/])", code)
    }


def test_the_troubleshooting_page_names_real_keys_and_what_roll_train_prints():
    page, keys = (REPO / "docs/troubleshooting.md").read_text(), config_keys()
    named = dotted_keys_named(page, keys)
    assert named and not named - keys, sorted(named - keys)
    cli = (REPO / "roll_lite/cli.py").read_text()
    outcomes = set(
        re.findall(
            r"\| `roll-train: (config error|data error|loss check|worker failure|rollout error|stopped by)", page
        )
    )
    assert len(outcomes) == 6 and all(
        f"roll-train: {outcome}" in cli or outcome == "worker failure" for outcome in outcomes
    )
    assert "worker failure: " in cli


def documented_runs() -> dict[tuple[str, str], set[tuple[str, ...]]]:
    """{(output_dir, run_name): the settings of each documented roll-train command writing there}."""
    runs = defaultdict(set)
    for block in doc_commands.blocks(lang="bash"):
        for line in doc_commands.command_lines(block.body):
            words = [word.replace("$PWD/", "") for word in shlex.split(line)]
            if "roll-train" not in words:
                continue
            words = words[words.index("roll-train") + 1 :]
            config_file = words[words.index("--config") + 1] if "--config" in words else None
            overrides = dict(word.split("=", 1) for word in words if "=" in word and not word.startswith("-"))
            written = yaml.safe_load((REPO / config_file).read_text()) if config_file else {}
            where = (
                overrides.pop("output_dir", written.get("output_dir", "outputs")),
                overrides.pop("run_name", written.get("run_name", "ppo_reverse_digits")),
            )
            overrides.pop("steps", None)  # raising steps= trains the same run further (docs/checkpoints.md)
            runs[where].add((config_file, *sorted(f"{k}={v}" for k, v in overrides.items())))
    return runs


def test_documented_runs_that_differ_are_named_apart():
    """Two documented commands that train differently write to different run directories: one that
    reused another's run_name found that run finished ("nothing was started") or refused to mix them."""
    clashes = {where: settings for where, settings in documented_runs().items() if len(settings) > 1}
    assert not clashes, "\n".join(f"{'/'.join(where)}: {sorted(settings)}" for where, settings in clashes.items())


def test_the_trl_page_names_real_keys_with_valid_values_and_its_example_loads():
    from roll_lite.config import load_config

    page, keys = (REPO / "docs/from-trl.md").read_text(), config_keys()
    assert not dotted_keys_named(page, keys) - keys, sorted(dotted_keys_named(page, keys) - keys)
    # the roll_lite column: outside its brackets (defaults, notes), every `code` span is a key or `key: value`
    settings = []
    for row in re.findall(r"^\| `[^\n]*", page, re.M):
        ours = re.split(r"(?<!\\)\|", row)[2]
        spans = re.findall(r"`([^`]+)`", re.sub(r"\([^()]*(?:\([^()]*\)[^()]*)*\)", "", ours))
        assert spans or ours.strip() == "none", f"no roll_lite key in: {row}"
        settings += [span.split(": ", 1) for span in spans]
    assert len(settings) > 50 and not {s[0] for s in settings} - keys, sorted({s[0] for s in settings} - keys)
    load_config(None, [f"{key}={value}" for key, value in (s for s in settings if len(s) == 2)])
    (example,) = [block.body for block in doc_commands.blocks([REPO / "docs/from-trl.md"], lang="yaml")]
    flat = flatten(yaml.safe_load(example))
    config = load_config(REPO / "configs/grpo.yaml", [f"{key}={value}" for key, value in flat.items()])
    assert (config.rollout.prompts_per_step, config.rollout.max_new_tokens, config.actor.lr) == (2, 16, 1e-4)


def flatten(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in tree.items():
        flat.update(flatten(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return flat
