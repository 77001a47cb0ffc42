"""The shell commands the README and docs/ show a reader, as a reader would copy them."""

from __future__ import annotations

import re
from pathlib import Path

from harness import REPO

SHELL_BLOCK = re.compile(r"```(?:sh|bash|shell)\n(.*?)```", re.S)


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def shell_blocks(document: Path) -> list[str]:
    return SHELL_BLOCK.findall(document.read_text())


def commands(block: str) -> list[str]:
    """The block's commands: continued lines joined (with one space, as the shell reads
    them), trailing `# …` comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    found = []
    for line in joined.splitlines():
        command = re.sub(r"\s+#.*$", "", line).strip()
        if command and not command.startswith("#"):
            found.append(command)
    return found


def documented_commands() -> list[tuple[str, str]]:
    """(document, command) of every command of every shell block."""
    return [(document.relative_to(REPO).as_posix(), command)
            for document in documents()
            for block in shell_blocks(document)
            for command in commands(block)]


def block_with(document: Path, command_prefix: str) -> list[str]:
    """The commands of the one shell block of `document` that has a command starting
    with `command_prefix`."""
    matching = [commands(block) for block in shell_blocks(document)
                if any(c.startswith(command_prefix) for c in commands(block))]
    assert len(matching) == 1, f"{document} should have one block running {command_prefix!r}"
    return matching[0]
