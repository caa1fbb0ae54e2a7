"""The guide's links and paths: every relative link and image of README.md, docs/*.md and the
tutorial's markdown cells points to a file of the repository; every repository path the
documents name under results/, checkpoints/, data/ or docs/ exists (docs/HISTORY.md excepted:
it names the paths of older commits on purpose); no document names a path of one machine; and
the README and docs/ stay short enough to read (10,000 and 120,000 characters).
Plain text only: no torch, no package import."""
import glob
import json
import re

import pytest

from conftest import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'(][^)]*)?\)")
REF_DEF = re.compile(r"""^[ ]{0,3}\[[^\]]+\]:[ \t]*<?([^\s<>]+)>?(?:[ \t]+(?:"[^"]*"|'[^']*'|\([^)]*\)))?[ \t]*$""",
                     re.M)
HTML_REF = re.compile(r"""<(?:a|img|source)\b[^>]*?\b(?:href|src)\s*=\s*["']([^"']+)["']""", re.I)
# A path of one machine: a home or scratch folder, a mount, a Windows drive. Preceded by a
# word character or a dot it is part of a URL or a relative path, and is left alone.
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:work|home|root|Users|tmp|mnt|private|var/folders)/"
                          r"|(?<![\w])[A-Za-z]:\\")
# A path after "COMMIT:" (git's rev:path) names a file of that commit, not of the checkout.
REPO_PATH = re.compile(r"(?<![\w./<:-])((?:results|checkpoints|data|docs)/[\w.*/-]*[\w*/])")


def notebook_markdown() -> str:
    nb = json.loads((ROOT / "tutorial.ipynb").read_text())
    return "\n\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")


def documents() -> list[tuple[str, object, str]]:
    """(name relative to the repository, folder its links are relative to, text)."""
    out = [(str(p.relative_to(ROOT)), p.parent, p.read_text()) for p in DOCS]
    out.append(("tutorial.ipynb", ROOT, notebook_markdown()))
    return out


def links(text: str) -> list[str]:
    """Targets of the inline links and images, reference definitions and HTML href/src,
    outside fenced code blocks and code spans."""
    prose = CODE_SPAN.sub("", FENCE.sub("", text))
    return [m.group(1) for pat in (INLINE_LINK, REF_DEF, HTML_REF) for m in pat.finditer(prose)]


def is_relative(target: str) -> bool:
    return not (re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith(("#", "//")))


def test_the_link_parser_finds_links_and_images_and_skips_code():
    text = ("See [a](docs/A.md#part) and ![fig](figures/f.png \"title\"), [b][1], <img src=\"x.png\">.\n"
            "[1]: other/B.md\n   [B, T]:  A = (alpha * p) * A\n`[not](a-link.md)`\n```\n[nor](this.md)\n```\n"
            "[web](https://example.org/x) [anchor](#here) [nested [text]](C.md)\n")
    assert sorted(links(text)) == sorted(["docs/A.md#part", "figures/f.png", "C.md", "other/B.md",
                                          "x.png", "https://example.org/x", "#here"])
    assert sorted(t for t in links(text) if is_relative(t)) == [
        "C.md", "docs/A.md#part", "figures/f.png", "other/B.md", "x.png"]


def test_the_machine_path_pattern():
    for bad in ("cd /work/main", "--out /tmp/diag", "/home/me/x", "see /Users/a/b", "C:\\data",
                "(/root/models)"):
        assert MACHINE_PATH.search(bad), bad
    for ok in ("https://github.com/root/x", "runs/tmp/x", "--model /path/to/Qwen", "./work/x",
               "data/kk_benchmark/", "https://download.pytorch.org/whl/cpu"):
        assert not MACHINE_PATH.search(ok), ok


@pytest.mark.parametrize("name,folder,text", documents(), ids=lambda v: v if isinstance(v, str) and
                         v.endswith((".md", ".ipynb")) else "")
def test_every_relative_link_resolves(name, folder, text):
    missing = []
    for target in links(text):
        if not is_relative(target):
            continue
        path = target.split("#", 1)[0].split("?", 1)[0]
        if path and not (folder / path).exists():
            missing.append(target)
    assert not missing, f"{name}: links to files that do not exist: {missing}"


@pytest.mark.parametrize("name,folder,text", documents(), ids=lambda v: v if isinstance(v, str) and
                         v.endswith((".md", ".ipynb")) else "")
def test_no_document_names_a_path_of_one_machine(name, folder, text):
    hits = [text[max(0, m.start() - 30): m.end() + 20].replace("\n", " ")
            for m in MACHINE_PATH.finditer(text)]
    assert not hits, f"{name} names a path of one machine: {hits}"


@pytest.mark.parametrize("name,folder,text", [d for d in documents() if d[0] != "docs/HISTORY.md"],
                         ids=lambda v: v if isinstance(v, str) and v.endswith((".md", ".ipynb")) else "")
def test_every_named_repository_path_exists(name, folder, text):
    """A results/, checkpoints/, data/ or docs/ path a document names (in prose, code or a
    command) exists, relative to the repository root: the files the guide cites are kept."""
    missing = sorted({p for p in REPO_PATH.findall(text) if not glob.glob(str(ROOT / p.rstrip("/")))
                      and not glob.glob(str(folder / p.rstrip("/")))})
    assert not missing, f"{name} names paths that do not exist: {missing}"


def test_readme_stays_a_guide():
    text = (ROOT / "README.md").read_text()
    assert len(text) <= 10_000, f"README.md has {len(text)} characters (at most 10,000)"
    opening = text[:text.index("\n## ")]
    for command in ("pip install -r requirements.txt", "python train.py", "python -m pytest -q"):
        assert command in opening, f"the README opens without {command!r}"


def test_the_docs_stay_readable_in_one_sitting():
    """docs/*.md hold at most 120,000 characters in all: a finding that still matters replaces
    an older line rather than adding to it (the full record is git's)."""
    sizes = {p.name: len(p.read_text()) for p in sorted((ROOT / "docs").glob("*.md"))}
    total = sum(sizes.values())
    assert len(sizes) >= 5          # the glob found the pages: the bound cannot pass on nothing
    assert total <= 120_000, f"docs/*.md hold {total:,} characters (at most 120,000): {sizes}"


def readme_first_commands() -> list[str]:
    """The commands of the README's first bash block (its opening: install, main job, tests),
    comments stripped."""
    block = re.search(r"^```bash\n(.*?)^```", (ROOT / "README.md").read_text(), re.S | re.M).group(1)
    return [line.split("#")[0].strip() for line in block.splitlines() if line.split("#")[0].strip()]


def test_ci_runs_exactly_the_readme_install_and_tests():
    """.ci/run's commands after its venv are the README's install and test commands, as
    written and in order, and nothing else installs or runs there: what CI tests is what a
    newcomer's two commands give."""
    readme = readme_first_commands()
    install = [c for c in readme if c.startswith("pip ")]
    tests = [c for c in readme if "pytest" in c]
    assert len(install) == 1 and len(tests) == 1, readme
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert f"INSTALL='{install[0]}'" in ci and f"TEST='{tests[0]}'" in ci
    after_venv = ci[ci.index(". .venv/bin/activate") + 1:]
    assert [line for line in after_venv if line.strip() and not line.startswith("#")] == install + tests
