"""Read the pages of an LMDB ``data.mdb`` with plain file I/O: only real pages speak.

LMDB 0.9 (the version py-lmdb bundles) lays a file out in pages of ``psize`` bytes: two
meta pages, then branch, leaf and overflow pages. A page header is ``pgno`` (u64, the
page's own number), a pad (u16), ``flags`` (u16) and either ``lower``/``upper`` (u16 each:
the end of the node-pointer array and the start of the nodes) or, on the first page of an
overflow run, the run's page count (u32). A leaf node is ``lo, hi, flags, ksize`` (u16
each), the key, then the value (``size = lo | hi << 16`` bytes) or, with ``F_BIGDATA``,
the u64 number of the overflow run that holds it; a branch node's ``lo, hi, flags`` are
its child's page number. Nodes are packed, each padded to an even size, from ``upper`` to
the page's end (an insert takes space below ``upper``, a delete closes its gap).

A page is real only when all of that agrees (structure only; LMDB 0.9 keeps no checksums
and values are never judged here): its ``pgno`` is its place in the file, its type is
one of branch / leaf / overflow, ``16 <= lower <= upper <= psize``, every node lies at or
above ``upper`` and inside the page, the nodes tile ``[upper, psize)`` exactly, every
child and overflow page number lies inside the file and an overflow run's count fits in
the file and holds the value that names it.

``Pages`` finds records two ways: ``tree`` walks the ``records`` B-tree from a meta page
(what LMDB itself reads); ``sweep`` reads every page in file order that no walk reached,
for what a cut or garbled branch hides. The sweep never reads inside a value: it skips
every overflow run a walk or an earlier page referenced and every run whose header it
meets, so a stored value holding the image of a page (a forged record) is read as the
value it is. Each page is parsed at most once per pass and each overflow value decoded at
most once: the work (``Pages.work``, bytes examined) is linear in the file's size.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

MAGIC, PAGEHDR, NODEHDR = 0xBEEFC0DE, 16, 8
P_BRANCH, P_LEAF, P_OVERFLOW, P_META = 1, 2, 4, 8
F_BIGDATA, F_SUBDATA = 1, 2
P_INVALID = 0xFFFF_FFFF_FFFF_FFFF
PAGE_SIZES = (4096, 8192, 16384, 32768, 65536)

_HDR = struct.Struct("<QHHHH")  # pgno, pad, flags, lower, upper
_NODE = struct.Struct("<HHHH")  # lo, hi, flags, ksize
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")

Node = tuple[bytes, int, bytes | int, int]  # key, node flags, inline value or run pgno, size


class Meta(tuple):
    """(txnid, psize, last page, main root) of a valid meta page."""

    txnid = property(lambda s: s[0])
    psize = property(lambda s: s[1])
    last = property(lambda s: s[2])
    root = property(lambda s: s[3])


def read_meta(data: bytes, off: int) -> Meta | None:
    """The meta page at ``off`` when its magic, version, flags and page size hold."""
    if len(data) < off + 152:
        return None
    flags = struct.unpack_from("<H", data, off + 10)[0]
    magic, version = struct.unpack_from("<II", data, off + 16)
    psize = _U32.unpack_from(data, off + 40)[0]
    last, txnid = struct.unpack_from("<QQ", data, off + 136)
    root = _U64.unpack_from(data, off + 128)[0]
    if magic != MAGIC or version != 1 or not flags & P_META or psize not in PAGE_SIZES:
        return None
    return Meta((txnid, psize, last, root))


def metas(data: bytes) -> list[Meta]:
    """The valid meta pages, newest (highest txnid) first."""
    found = []
    m0 = read_meta(data, 0)
    if m0 is not None:
        found.append(m0)
    for psize in PAGE_SIZES:  # meta 1 lies one page further, at its own page size
        m1 = read_meta(data, psize)
        if m1 is not None and m1.psize == psize:
            found.append(m1)
            break
    return sorted(found, reverse=True)


def ovpages(size: int, psize: int) -> int:
    """Pages an overflow run needs for a ``size``-byte value (LMDB's OVPAGES)."""
    return (PAGEHDR - 1 + size) // psize + 1


class Pages:
    """Structural reader of one ``data.mdb`` image."""

    def __init__(self, data: bytes, psize: int | None = None):
        self.data = data
        self.metas = metas(data)
        self.psize = psize or (self.metas[0].psize if self.metas else 4096)
        self.npages = len(data) // self.psize  # whole pages in the file
        # a cut file may end inside an overflow run whose value lies before the cut: run
        # counts and page numbers are bounded by the pages the meta pages name, the last
        # one partial or not
        self.limit = max([-(-len(data) // self.psize)] + [m.last + 1 for m in self.metas])
        self.work = 0  # bytes examined: headers, nodes and decoded values
        self.rejected = 0  # pages that named themselves but failed a structural check
        self.seen: set[int] = set()  # pages parsed by a walk (the sweep skips them)
        self.values: dict[int, int] = {}  # overflow run start -> its page count

    # -- one page --------------------------------------------------------------------
    def overflow(self, p: int) -> int | None:
        """The page count of a real overflow run starting at page ``p``."""
        if p < 2 or p * self.psize + PAGEHDR > len(self.data):
            return None
        pgno, _, flags = _HDR.unpack_from(self.data, p * self.psize)[:3]
        self.work += PAGEHDR
        n = _U32.unpack_from(self.data, p * self.psize + 12)[0]
        if pgno != p or flags != P_OVERFLOW or not 1 <= n <= self.limit - p:
            return None
        return n

    def nodes(self, p: int) -> tuple[int, list[Node]] | None:
        """(flags, nodes) of a real branch or leaf page ``p``; None for anything else.
        A branch node's value is its child's page number."""
        if not 2 <= p < self.npages:
            return None
        data, psize, off = self.data, self.psize, p * self.psize
        pgno, _, flags, lower, upper = _HDR.unpack_from(data, off)
        self.work += PAGEHDR
        if pgno != p or flags not in (P_BRANCH, P_LEAF):
            return None
        if not PAGEHDR <= lower <= upper <= psize or (lower - PAGEHDR) % 2:
            return self._reject()
        n = (lower - PAGEHDR) // 2
        if n == 0 and flags == P_BRANCH:
            return self._reject()
        ptrs = struct.unpack_from(f"<{n}H", data, off + PAGEHDR)
        self.work += 2 * n
        out: list[Node] = []
        spans = []
        for ptr in ptrs:
            if ptr < upper or ptr + NODEHDR > psize:
                return self._reject()
            lo, hi, nflags, ksize = _NODE.unpack_from(data, off + ptr)
            self.work += NODEHDR
            kstart = off + ptr + NODEHDR
            if flags == P_BRANCH:
                size, child = NODEHDR + ksize, lo | hi << 16 | nflags << 32
                if not 2 <= child < self.limit:
                    return self._reject()
                value: bytes | int = child
                dsize = 0
            else:
                dsize = lo | hi << 16
                big = nflags & F_BIGDATA
                size = NODEHDR + ksize + (8 if big else dsize)
                if ptr + size > psize:
                    return self._reject()
                if big:
                    value = _U64.unpack_from(data, kstart + ksize)[0]
                    if not 2 <= value < self.limit:
                        return self._reject()
                else:
                    value = data[kstart + ksize : kstart + ksize + dsize]
                    self.work += dsize
            if ptr + size > psize:
                return self._reject()
            spans.append((ptr, size + (size & 1)))
            out.append((data[kstart : kstart + ksize], nflags, value, dsize))
            self.work += ksize
        spans.sort()
        at = upper
        for start, length in spans:  # the nodes tile [upper, psize): no overlap, no gap
            if start != at:
                return self._reject()
            at = start + length
        if at != psize:
            return self._reject()
        return flags, out

    def _reject(self) -> None:
        self.rejected += 1
        return None

    def big_value(self, pgno: int, size: int) -> bytes | None:
        """The ``size``-byte value in the overflow run at ``pgno`` (None: no such run, or
        read already: the older meta's tree shares the newest one's unchanged runs, and a
        damaged tree naming one run many times costs one read)."""
        if pgno in self.values:
            return None
        n = self.overflow(pgno)
        if n is None or n < ovpages(size, self.psize):
            return None
        self.values[pgno] = n
        start = pgno * self.psize + PAGEHDR
        self.work += size
        value = self.data[start : start + size]
        return value if len(value) == size else None  # cut short

    # -- the B-tree ------------------------------------------------------------------
    def walk(self, root: int) -> Iterator[Node]:
        """The leaf nodes under ``root``, depth first; cycles and bad pages stop a branch
        (what lies under it is left to the sweep)."""
        stack, visited = [root], set()
        while stack:
            p = stack.pop()
            if p in visited or p == P_INVALID:
                continue
            visited.add(p)
            page = self.nodes(p)
            if page is None:
                continue
            self.seen.add(p)
            flags, nodes = page
            if flags == P_BRANCH:
                stack.extend(child for _, _, child, _ in reversed(nodes))
            else:
                yield from nodes

    def table_root(self, meta: Meta, name: bytes) -> int | None:
        """The root page of the named sub-database in ``meta``'s main tree."""
        for key, nflags, value, _ in self.walk(meta.root):
            if key == name and nflags & F_SUBDATA and isinstance(value, bytes) and len(value) == 48:
                return _U64.unpack_from(value, 40)[0]
        return None

    def tree(self, meta: Meta, name: bytes = b"records") -> Iterator[tuple[bytes, bytes]]:
        """(key, value) of every plain entry reachable in table ``name`` from ``meta``."""
        root = self.table_root(meta, name)
        if root is None:
            return
        for key, nflags, value, size in self.walk(root):
            if nflags & ~F_BIGDATA:
                continue  # a sub-database or a duplicate set: an index, rebuilt on repair
            if nflags & F_BIGDATA:
                value = self.big_value(value, size)
                if value is None:
                    continue
            yield key, value

    # -- the sweep -------------------------------------------------------------------
    def sweep(self) -> Iterator[tuple[bytes | None, bytes]]:
        """(key, value) of every plain leaf entry on a real page no walk reached, and
        (None, value) for each overflow run no node referenced, in file order. Pages
        inside an overflow run are never read as pages."""
        p = 2
        while p * self.psize + PAGEHDR <= len(self.data):
            if p in self.values:  # a run a node referenced: its value, not pages
                p += self.values[p]
                continue
            n = self.overflow(p)
            if n is not None:  # an unreferenced run: its whole extent is one value
                self.values[p] = n
                yield None, self._run(p, n)
                p += n
                continue
            if p not in self.seen:
                page = self.nodes(p)
                if page is not None and page[0] == P_LEAF:
                    yield from self._swept_leaf(page[1])
            p += 1

    def _swept_leaf(self, nodes: list[Node]) -> Iterator[tuple[bytes | None, bytes]]:
        for key, nflags, value, _ in nodes:
            if nflags & ~F_BIGDATA:
                continue
            if not nflags & F_BIGDATA:
                yield key, value
            elif value not in self.values and (n := self.overflow(value)) is not None:
                # the run this (perhaps stale) node names: marked so the sweep skips its
                # pages, read once, as the sweep reads any run (a freed run may hold
                # another value since, so its content names its id, not this node's key)
                self.values[value] = n
                yield None, self._run(value, n)

    def _run(self, p: int, n: int) -> bytes:
        value = self.data[p * self.psize + PAGEHDR : (p + n) * self.psize]
        self.work += len(value)
        return value


__all__ = ["Meta", "Pages", "metas", "ovpages", "read_meta"]
