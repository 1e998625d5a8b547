#!/usr/bin/env python3
"""Fails when a relative link in the repository's Markdown points at nothing (standard library only).

    python3 tools/check_links.py [REPO_ROOT]
    python3 tools/check_links.py --self-test

Checks every Markdown file of the tree that git tracks or would track (where the tree is no git work tree: every one
but those in hidden folders, build*/ at the root and target/): the top-level pages (README.md, CHANGELOG.md, ...),
docs/, notes/, models/, data/, the crates' READMEs. A link is `[text](target)`, `![alt](target)` or a reference
definition `[label]: target`, outside code blocks and code spans. External targets (any `scheme:`) are skipped. For
the rest:
  - the file or folder must exist, relative to the page (or to REPO_ROOT when it starts with /);
  - `#anchor` (on its own: the page itself) into a Markdown file must be a heading's GitHub slug there (lower case,
    punctuation but - and _ dropped, each space a -, a repeated heading's slug numbered -1, -2, ...) or an explicit
    `id="..."` / `name="..."`; anchors into other files (`main.cpp#L10`) are not checked.
Prints one line per broken link, FILE:LINE: TARGET: why, and exits 1 when there is any.

--self-test checks the checker: it writes a small tree with good links and three broken ones (a missing file, a
missing anchor on the page, a missing anchor in another page), and exits 0 only when exactly the three are reported.
"""
import os
import re
import subprocess
import sys
import tempfile
import urllib.parse

SKIP_DIRS = {"target", "node_modules", "__pycache__"}
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
# A code span: a run of backticks, text without a blank line, the same run (CommonMark).
CODE_SPAN = re.compile(r"(`+)((?:(?!\n[ \t]*\n).)+?)(?<!`)\1(?!`)", re.S)
INLINE_LINK = re.compile(r"\]\(\s*(<[^>\n]*>|[^)\s]+)(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]\n]+\]:[ \t]*(<[^>\n]*>|\S+)", re.M)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
ATX_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
SETEXT_UNDERLINE = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
EXPLICIT_ANCHOR = re.compile(r"""<[^>]*\s(?:id|name)\s*=\s*["']([^"']+)["']""")


def markdown_files(root):
    """Every .md file under root: git's tracked and untracked but not ignored ones where root is in a git work tree,
    else a walk of the tree (see SKIP_DIRS)."""
    try:
        listed = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                                 "--", "*.md"], capture_output=True, check=True).stdout.decode()
        names = sorted({name for name in listed.split("\0") if name})
        yield from (os.path.join(root, name) for name in names if os.path.isfile(os.path.join(root, name)))
        return
    except (OSError, subprocess.CalledProcessError):
        pass
    for folder, dirs, files in os.walk(root):
        top = os.path.samefile(folder, root)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS
                         and not (top and d.startswith("build")))
        for name in sorted(files):
            if name.endswith(".md"):
                yield os.path.join(folder, name)


def blank_fences(text):
    """The text with fenced code blocks blanked (their lines kept empty, so lines still count)."""
    lines, fence = [], None
    for line in text.split("\n"):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
            lines.append("")
        elif fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not line.strip(" `~"):
                fence = None
            lines.append("")
        else:
            lines.append(line)
    return "\n".join(lines)


def blank_code(text):
    """The text with fenced code blocks and code spans blanked (newlines kept)."""
    return CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), blank_fences(text))


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors_of(path, cache={}):
    if path not in cache:
        text = blank_fences(open(path, encoding="utf-8").read())  # headings keep their code spans' text
        seen, anchors = {}, set(EXPLICIT_ANCHOR.findall(blank_code(text)))
        lines = text.split("\n")
        for i, line in enumerate(lines):
            m = ATX_HEADING.match(line)
            heading = m.group(2) if m else None
            if heading is None and i + 1 < len(lines) and line.strip() and SETEXT_UNDERLINE.match(lines[i + 1]) \
                    and not line.startswith((" " * 4, "\t", "|", "-", "*", ">")):
                heading = line.strip()
            if heading is None:
                continue
            base = slug(heading)
            n = seen.get(base, 0)
            seen[base] = n + 1
            anchors.add(base if n == 0 else f"{base}-{n}")
        cache[path] = anchors
    return cache[path]


def check_target(root, page, target):
    """None when the target is fine, else why not."""
    if target.startswith("<") and target.endswith(">"):
        target = target[1:-1]
    if not target or SCHEME.match(target):
        return None
    path, _, anchor = target.partition("#")
    path = urllib.parse.unquote(path.split("?", 1)[0])
    if not path:
        dest = page
    elif path.startswith("/"):
        dest = os.path.join(root, path.lstrip("/"))
    else:
        dest = os.path.normpath(os.path.join(os.path.dirname(page), path))
    if not os.path.exists(dest):
        return "no such file or folder"
    if anchor and os.path.isfile(dest) and dest.endswith(".md"):
        anchor = urllib.parse.unquote(anchor)
        if anchor not in anchors_of(dest):
            return f"no heading with the anchor #{anchor} in {os.path.relpath(dest, root)}"
    return None


def check(root):
    """[(page relative to root, line, target, why)] of every broken link under root."""
    problems = []
    for page in markdown_files(root):
        text = blank_code(open(page, encoding="utf-8").read())
        for pattern in (INLINE_LINK, REFERENCE_DEF):
            for m in pattern.finditer(text):
                why = check_target(root, page, m.group(1))
                if why:
                    line = text.count("\n", 0, m.start(1)) + 1
                    problems.append((os.path.relpath(page, root), line, m.group(1), why))
    return sorted(problems)


def self_test():
    pages = {
        "README.md": "# Top\n\nSee [the guide](docs/guide.md), [its setup](docs/guide.md#set-up-the-tools),\n"
                     "[a folder](docs/), [a missing page](docs/missing.md) and [here](#top).\n\n"
                     "```sh\n[not a link](nowhere.md)\n```\n\n"
                     "Also `[code](nowhere.md)` and [ext](https://x.invalid/y).\n",
        "docs/guide.md": "Guide\n=====\n\n## Set up the `tools`\n\n## Run\n\n## Run\n\n"
                         "[again](#run-1), [up](../README.md#top), [gone](#no-such-heading),\n"
                         "[elsewhere](../README.md#nothing-here) and [a line](../README.md).\n",
    }
    expected = [("README.md", 4, "docs/missing.md"), ("docs/guide.md", 10, "#no-such-heading"),
                ("docs/guide.md", 11, "../README.md#nothing-here")]
    with tempfile.TemporaryDirectory() as root:
        for name, text in pages.items():
            os.makedirs(os.path.join(root, os.path.dirname(name)), exist_ok=True)
            with open(os.path.join(root, name), "w", encoding="utf-8") as f:
                f.write(text)
        found = [(page, line, target) for page, line, target, _ in check(root)]
    if found != expected:
        print(f"check_links.py --self-test: expected {expected}, found {found}")
        return 1
    print(f"check_links.py --self-test: the {len(expected)} broken links and no others were reported")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    problems = check(root)
    for page, line, target, why in problems:
        print(f"{page}:{line}: {target}: {why}")
    pages = sum(1 for _ in markdown_files(root))
    print(f"check_links.py: {len(problems)} broken links in {pages} Markdown files under {root}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
