"""The map of the code in docs/development.md ("Layout") against the tree: every path it
names exists, every folder and top-level module of src/ has an entry, and every file of
a folder is named in that folder's entry, so that the map cannot drift from the code."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"


def entries():
    """The Layout block's entries: path -> its description (continuation lines joined)."""
    text = (ROOT / "docs" / "development.md").read_text()
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    found, current = {}, None
    for line in block.splitlines():
        if line and not line[0].isspace():
            path, _, rest = line.partition(" ")
            current = path.strip()
            found[current] = rest.strip()
        elif current and line.strip():
            found[current] += " " + line.strip()
    return found


def test_every_path_the_map_names_exists():
    missing = [p for p in entries() if "*" not in p and not (ROOT / p).exists()]
    assert missing == []


def test_every_folder_and_top_level_module_of_src_has_an_entry():
    named = set(entries())
    wanted = {f"src/{p.relative_to(SRC)}/" for p in SRC.rglob("*") if p.is_dir()}
    # a folder that only holds a module's own submodules (approval/fuzz.rs) is named
    # with that module
    wanted = {w for w in wanted if (SRC / w[4:].rstrip("/")).with_suffix(".rs").exists() is False}
    wanted |= {f"src/{p.name}" for p in SRC.glob("*.rs") if p.name != "lib.rs"}
    assert sorted(wanted - named) == []


def test_every_file_of_a_folder_is_named_in_its_entry():
    unnamed = []
    for path, description in entries().items():
        folder = ROOT / path
        if not (path.startswith("src/") and path.endswith("/") and folder.is_dir()):
            continue
        for file in sorted(folder.glob("*.rs")):
            if file.name == "mod.rs":
                continue
            named = re.search(rf"(?<![\w/]){re.escape(file.name)}", description)
            has_own_entry = f"{path}{file.name}" in entries()
            if not named and not has_own_entry:
                unnamed.append(f"{path}{file.name}")
    assert unnamed == []
