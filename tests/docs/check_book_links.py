#!/usr/bin/env python3
"""Every link of the built documentation (mdBook's output) leads to a file of the book,
and every #anchor to an element with that id. Usage: check_book_links.py target/book.
Exits 1 naming each broken link: a link that works in the Markdown but not in the site
(a page missing from SUMMARY.md, a link outside docs/) fails the build here."""

from __future__ import annotations

import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit


class Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name == "id":
                self.ids.add(value)
            elif (name == "href" and tag == "a") or (name == "src" and tag in ("img", "script")):
                self.links.append(value)


def parse(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text(errors="replace"))
    return page


def main(book: Path) -> int:
    book = book.resolve()
    pages = {path: parse(path) for path in book.rglob("*.html")}
    if len(pages) < 10 or not (book / "index.html").is_file():
        print(f"{book} holds no built book ({len(pages)} pages)", file=sys.stderr)
        return 1
    broken = []
    for path, page in pages.items():
        if path.name in ("404.html", "print.html", "toc.html"):
            continue  # mdBook's own: absolute to the site's root, or a copy of every page
        for link in page.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith("javascript:"):
                continue
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path.resolve()
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file() or book.resolve() not in target.parents:
                broken.append(f"{path.relative_to(book)}: {link} leads nowhere")
                continue
            if parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else parse(target).ids
                if parts.fragment not in ids:
                    broken.append(f"{path.relative_to(book)}: {link} names no element of {target.name}")
    for line in sorted(set(broken)):
        print(line, file=sys.stderr)
    print(f"{len(pages)} pages, {sum(len(p.links) for p in pages.values())} links, {len(set(broken))} broken")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
