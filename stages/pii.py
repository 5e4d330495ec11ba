"""Personal data: find, validate and replace (or count, or drop the document for) e-mail addresses,
public IP addresses, mainland-China resident ID numbers, phone numbers and bank card numbers.

Fast on a corpus where most documents hold none: one RE2 pass over the whole batch (Arrow's
`match_substring_regex`) picks the documents that may hold any, and only those go through the
Python patterns, whose matches are then validated:
- resident ID numbers (GB 11643-1999): 18 characters, a real birth date (1900 up to today), and
  the ISO 7064 MOD 11-2 check digit, so random 18-digit numbers, order numbers and timestamps stay;
  and the first-generation 15-digit numbers (issued until 1999: region code, birth date YYMMDD in
  the 1900s, 3-digit sequence, no check digit): a province-level region code (GB/T 2260) and a
  date that exists, so about 1.4% of random 15-digit numbers pass;
- bank card numbers: 13-19 digits (runs of 4 may be separated by a space or hyphen), an issuer
  prefix used by card networks (UnionPay 62, Visa 4, Mastercard 51-55 / 2221-2720, Amex 34/37,
  JCB 35, Diners 30/36/38, Discover 60/64/65) and the Luhn check;
- IP addresses: parsed by `ipaddress`; only globally routed ones count (private, loopback,
  link-local, documentation and reserved ranges stay); a dotted quad after "section", "第",
  "version" ..., before a no-break space, or starting a line and followed by a period is a section
  or version number (12.2.1.1. in a manual), and an IPv6 match needs three groups (a:: is not one);
- e-mail addresses, except image names such as logo@2x.png;
- phones: mainland mobile numbers (1[3-9]x, 11 digits, optional +86/0086), numbers with a leading
  `+` country code (8-15 digits), North American (xxx) xxx-xxxx / xxx-xxx-xxxx, and Chinese
  landlines 0xx(x)-xxxxxxx(x); a +number without separators needs 10 digits (+32768000 is a number).
Where two matches overlap the kind tried first wins (e-mail, ID number, bank card, phone, IP).
"""
from __future__ import annotations

import datetime as _dt
import ipaddress
import re
from typing import Any, Callable, Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from .base import BatchResult, removed_frame

KINDS = ("email", "id_number", "bank_card", "phone", "ip")
DEFAULT_TOKENS = {"email": "<EMAIL>", "id_number": "<ID_NUMBER>", "bank_card": "<BANK_CARD>", "phone": "<PHONE>",
                  "ip": "<IP>"}
ACTIONS = ("replace", "drop", "count", "off")

# per kind, an RE2 pattern every match satisfies: Arrow runs them over the lines of a whole batch,
# and the Python patterns (with look-arounds and validation) only see the lines they flag
PREFILTERS = {
    "email": r"[A-Za-z0-9]@[A-Za-z0-9-]+\.[A-Za-z]",
    "id_number": r"\d{17}[\dXx]|\d{15}",
    "bank_card": r"\d{4}[ -]?\d{4}[ -]?\d{4}[ -]?\d",
    "phone": r"1[3-9]\d[ -]?\d{4}[ -]?\d{4}|\+ ?\d|\(\d{3}\) ?\d{3}|\d{3}[-.]\d{3}[-.]\d{4}|0\d{2,3}-\d{7}",
    "ip": r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}|[0-9A-Fa-f]{0,4}:[0-9A-Fa-f]{0,4}:[0-9A-Fa-f]{0,4}",
}
_PREFILTER = "|".join(f"(?:{v})" for v in PREFILTERS.values())

_NOT_ALNUM_BEFORE = r"(?<![0-9A-Za-z])"
_NOT_ALNUM_AFTER = r"(?![0-9A-Za-z])"
PATTERNS: dict[str, re.Pattern] = {
    "email": re.compile(r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9][A-Za-z0-9._%+-]{0,63}@"
                        r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,24}(?![A-Za-z0-9-])"),
    "id_number": re.compile(_NOT_ALNUM_BEFORE + r"(?<!\d\.)[1-9]\d{5}(?:(?:18|19|20)\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])"
                            r"\d{3}[0-9Xx]|\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])\d{3})(?![0-9A-Za-z]|\.\d)"),  # not digits of a decimal number
    "bank_card": re.compile(r"(?<![0-9A-Za-z-])(?:\d{13,19}|\d{4}(?:([ -])\d{4})(?:\1\d{4}){1,2}(?:\1\d{1,4})?)"
                            r"(?![0-9A-Za-z]|-\d)"),
    "phone": re.compile("|".join([
        # mainland mobile, optionally with +86 / 0086 / (+86)
        r"(?<![0-9A-Za-z+])(?:(?:\(?\+86\)?|0086)[ -]?)?1[3-9]\d(?:[ -]?\d{4}){2}(?![0-9A-Za-z])",
        # international: + country code, then groups separated by space, dot or hyphen (or one (area) group)
        r"(?<![0-9A-Za-z+])\+[1-9]\d{0,2}(?:[ .-]?\(\d{1,4}\))?(?:[ .-]?\d{1,5}){1,6}(?![0-9A-Za-z])",
        # North American without a country code
        r"(?<![0-9A-Za-z])(?:\(\d{3}\) ?|\d{3}[-.])\d{3}[-.]\d{4}(?![0-9A-Za-z]|[-.]\d)",
        # Chinese landline with its area code
        r"(?<![0-9A-Za-z-])0\d{2,3}-\d{7,8}(?![0-9A-Za-z]|-\d)",
    ])),
    "ip": re.compile(r"(?<![0-9A-Za-z.])(?:\d{1,3}\.){3}\d{1,3}(?![0-9A-Za-z]|\.\d)"
                     r"|(?<![0-9A-Za-z:])(?=[0-9A-Fa-f:]*::|(?:[0-9A-Fa-f]{1,4}:){7})"
                     r"(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![0-9A-Za-z:])"),
}

_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_ID_CHECK = "10X98765432"
_PHONE_DIGITS = (8, 15)  # ITU E.164: at most 15 digits; fewer than 8 is not a full number


# GB/T 2260 province-level codes: the first two digits of every resident ID number's region code
PROVINCES = frozenset({11, 12, 13, 14, 15, 21, 22, 23, 31, 32, 33, 34, 35, 36, 37, 41, 42, 43, 44, 45, 46, 50, 51, 52,
                       53, 54, 61, 62, 63, 64, 65, 71, 81, 82})


def id15_valid(s: str) -> bool:
    """A first-generation (15-digit, before 1999) resident ID number: a province-level region code and a
    birth date 19YY-MM-DD that exists. There is no check digit: the region and the date are the check."""
    if len(s) != 15 or not s.isdigit() or int(s[:2]) not in PROVINCES:
        return False
    try:
        _dt.date(1900 + int(s[6:8]), int(s[8:10]), int(s[10:12]))
    except ValueError:
        return False
    return True


def id_number_valid(s: str, today: Optional[_dt.date] = None) -> bool:
    """GB 11643-1999: a birth date that exists and is not in the future, and the MOD 11-2 check digit;
    or a valid 15-digit number of the first generation (`id15_valid`)."""
    if len(s) == 15:
        return id15_valid(s)
    if len(s) != 18 or not s[:17].isdigit():
        return False
    try:
        born = _dt.date(int(s[6:10]), int(s[10:12]), int(s[12:14]))
    except ValueError:
        return False
    if born.year < 1900 or born > (today or _dt.date.today()):
        return False
    total = sum(int(d) * w for d, w in zip(s[:17], _ID_WEIGHTS))
    return _ID_CHECK[total % 11] == s[17].upper()


def luhn_valid(digits: str) -> bool:
    """The Luhn (mod 10) check every payment card number carries."""
    total, double = 0, False
    for ch in reversed(digits):
        d = ord(ch) - 48
        if double:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
        double = not double
    return total % 10 == 0


def _card_prefix(d: str) -> bool:
    """An issuer identification number of a card network, with a length that network issues."""
    n = len(d)
    if d.startswith("62"):  # China UnionPay
        return 16 <= n <= 19
    if d[0] == "4":  # Visa
        return n in (13, 16, 19)
    if "51" <= d[:2] <= "55" or "2221" <= d[:4] <= "2720":  # Mastercard
        return n == 16
    if d[:2] in ("34", "37"):  # American Express
        return n == 15
    if d[:2] == "35":  # JCB
        return 16 <= n <= 19
    if d[:2] in ("30", "36", "38"):  # Diners Club
        return 14 <= n <= 19
    if d.startswith("6011") or d[:2] in ("64", "65"):  # Discover
        return 16 <= n <= 19
    return False


def bank_card_valid(s: str) -> bool:
    digits = s.replace(" ", "").replace("-", "")
    return 13 <= len(digits) <= 19 and _card_prefix(digits) and luhn_valid(digits) and not id_number_valid(digits)


def ip_public(s: str) -> bool:
    """A globally routed address (not private, loopback, link-local, documentation, reserved, multicast)."""
    try:
        addr = ipaddress.ip_address(s)
    except ValueError:
        return False
    return addr.is_global and not addr.is_multicast


def phone_valid(s: str) -> bool:
    """8-15 digits; a +number without any separator needs 10 (a signed +32768000 is a number, not a phone)."""
    digits = sum(ch.isdigit() for ch in s)
    if s.startswith("+") and s[1:].isdigit() and digits < 10:
        return False
    return _PHONE_DIGITS[0] <= digits <= _PHONE_DIGITS[1]


_FILE_SUFFIXES = {"png", "jpg", "jpeg", "gif", "svg", "webp", "ico", "bmp", "tif", "tiff", "css", "js", "pdf"}


def email_valid(s: str) -> bool:
    """Not an image name such as logo@2x.png."""
    return s.rsplit(".", 1)[-1].lower() not in _FILE_SUFFIXES


_SECTION_WORDS = ("第", "节", "章", "section", "chapter", "§", "version", "ver.", "版本", "release")


def ip_in_context(text: str, s: int, e: int) -> bool:
    """Whether a dotted quad (or IPv6 address) reads as an address in its place, not a section or
    version number: not preceded by section/version words, not followed by a no-break space, and a
    dotted quad that starts a line is not followed by a period (a heading's "12.2.1.1.")."""
    before = text[max(0, s - 12):s].lower()
    if any(w in before for w in _SECTION_WORDS):
        return False
    after = text[e:e + 2]
    if after[:1] == "\xa0" or after == ".\xa0":
        return False
    if ":" not in text[s:e] and after[:1] == "." and not text[text.rfind("\n", 0, s) + 1:s].strip():
        return False
    return True


def ip_public_v6_shape(s: str) -> bool:
    """An IPv6 match needs three groups with digits (a::, %a::, ::1:25 are not addresses in text)."""
    return ":" not in s or (not s.startswith("::") and sum(1 for g in s.split(":") if g) >= 3)


VALIDATORS: dict[str, Callable[[str], bool]] = {
    "email": email_valid, "id_number": id_number_valid, "bank_card": bank_card_valid,
    "phone": phone_valid, "ip": lambda s: ip_public_v6_shape(s) and ip_public(s),
}
IN_CONTEXT: dict[str, Callable[[str, int, int], bool]] = {"ip": ip_in_context}


def find_pii(text: str, kinds: tuple[str, ...] = KINDS) -> list[tuple[int, int, str]]:
    """Validated, non-overlapping matches (start, end, kind) in text order; an earlier kind of
    `kinds` wins an overlap."""
    taken: list[tuple[int, int, str]] = []
    for kind in kinds:
        ok, fits = VALIDATORS[kind], IN_CONTEXT.get(kind)
        for m in PATTERNS[kind].finditer(text):
            s, e = m.span()
            if ok(m.group()) and (fits is None or fits(text, s, e)) and not any(s < te and ts < e for ts, te, _ in taken):
                taken.append((s, e, kind))
    return sorted(taken)


def mask(value: str) -> str:
    """A match as the report shows it: its first 3 and last 2 characters, the rest as '*' (an
    e-mail keeps its first character and its domain)."""
    if "@" in value:
        user, _, domain = value.partition("@")
        return user[:1] + "*" * (len(user) - 1) + "@" + domain
    if len(value) <= 6:
        return "*" * len(value)
    return value[:3] + "".join("*" if ch.isalnum() else ch for ch in value[3:-2]) + value[-2:]


def masked_context(text: str, spans: list[tuple[int, int, str]], match: tuple[int, int], chars: int) -> str:
    """`chars` characters either side of `match`, the match masked between ⟦ ⟧ and every other match
    in the window masked too."""
    lo, hi = max(0, match[0] - chars), min(len(text), match[1] + chars)
    out, pos = [], lo
    for s, e, _ in spans:
        if e <= lo or s >= hi:
            continue
        s, e = max(s, lo), min(e, hi)
        out.append(text[pos:s])
        out.append("⟦" + mask(text[s:e]) + "⟧" if (s, e) == match else mask(text[s:e]))
        pos = e
    out.append(text[pos:hi])
    return "".join(out)


def candidates(texts: pa.Array) -> np.ndarray:
    """Rows that may hold personal data (one RE2 pass over the batch)."""
    if not len(texts):
        return np.zeros(0, dtype=bool)
    return pc.fill_null(pc.match_substring_regex(texts, _PREFILTER), False).to_numpy(zero_copy_only=False)


def _flagged_lines(texts: pa.Array, rows: np.ndarray, kinds: tuple[str, ...]) -> tuple[list, np.ndarray, dict]:
    """The lines of the candidate rows that any prefilter flags (no pattern crosses a line break):
    their text, (row, line number) of each, and per kind the mask of the lines its RE2 prefilter flags."""
    lines = pc.split_pattern(texts.take(pa.array(rows, pa.int64())), "\n")
    offsets = lines.offsets.to_numpy()
    counts = np.diff(offsets - offsets[0])
    flat = pc.list_flatten(lines)
    hit = np.flatnonzero(pc.fill_null(pc.match_substring_regex(flat, _PREFILTER), False).to_numpy(zero_copy_only=False))
    flagged = flat.take(pa.array(hit, pa.int64()))
    owner = np.repeat(rows, counts)[hit]
    line_no = hit - np.repeat(offsets[:-1] - offsets[0], counts)[hit]
    flags = {k: pc.fill_null(pc.match_substring_regex(flagged, PREFILTERS[k]), False).to_numpy(zero_copy_only=False)
             for k in kinds}
    return flagged.to_pylist(), np.stack([owner, line_no], axis=1), flags


def pii_batch(df: pd.DataFrame, actions: dict[str, str], tokens: dict[str, str], examples: int = 3,
              context_chars: int = 40, audit_text_chars: Optional[int] = 2000) -> BatchResult:
    """Find personal data in one partition: `actions[kind]` is replace (by `tokens[kind]`), drop
    (the document goes, reason `pii`, its score the number of such matches), count (left as it
    is) or off. Stats count matches and documents per kind; `examples` per kind are kept with
    their context, the match masked (`mask`); a dropped document's audit text has every match
    replaced by its token.

    Vectorised where the work is: one RE2 pass over the batch picks the candidate documents, their
    lines are split and flagged per kind by RE2 in Arrow, and only flagged lines go through the
    Python patterns and validators."""
    kinds = tuple(k for k in KINDS if actions.get(k, "off") != "off")
    texts = pa.array(df["text"], type=pa.string())
    hit_rows = np.flatnonzero(candidates(texts)) if kinds else np.zeros(0, dtype=np.int64)
    found = dict.fromkeys(kinds, 0)
    docs = dict.fromkeys(kinds, 0)
    drop_score = np.zeros(len(df), dtype=np.int64)
    shown: dict[str, list[dict]] = {}
    changed_lines: dict[int, dict[int, tuple[str, str]]] = {}  # row -> {line index: (kept text, audit text)}
    doc_kinds: dict[int, set] = {}
    if len(hit_rows):
        lines, where, flags = _flagged_lines(texts, hit_rows, kinds)
        for j, line in enumerate(lines):
            spans = find_pii(line, tuple(k for k in kinds if flags[k][j]))
            if not spans:
                continue
            i, line_no = int(where[j, 0]), int(where[j, 1])
            out, audit_out, last = [], [], 0
            for s, e, kind in spans:
                found[kind] += 1
                doc_kinds.setdefault(i, set()).add(kind)
                if actions[kind] == "drop":
                    drop_score[i] += 1
                if len(shown.setdefault(kind, [])) < examples:
                    shown[kind].append({"id": str(df["id"].iat[i]), "match": mask(line[s:e]),
                                        "context": masked_context(line, spans, (s, e), context_chars)})
                out += [line[last:s], tokens[kind] if actions[kind] == "replace" else line[s:e]]
                audit_out += [line[last:s], tokens[kind]]  # an audit row never shows the personal data
                last = e
            changed_lines.setdefault(i, {})[line_no] = ("".join(out) + line[last:], "".join(audit_out) + line[last:])
    for kinds_of_doc in doc_kinds.values():
        for kind in kinds_of_doc:
            docs[kind] += 1
    drop = drop_score > 0
    new_texts: dict[int, str] = {}
    audit: dict[int, str] = {}
    for i, changes in changed_lines.items():
        lines = texts[i].as_py().split("\n")
        kept_lines, audit_lines = list(lines), list(lines)
        for k, (kept, audited) in changes.items():
            kept_lines[k], audit_lines[k] = kept, audited
        if drop[i]:
            audit[i] = "\n".join(audit_lines)
        elif kept_lines != lines:
            new_texts[i] = "\n".join(kept_lines)
    out_df = df.copy()
    if new_texts:
        changed = np.zeros(len(df), dtype=bool)
        changed[list(new_texts)] = True
        column = pc.replace_with_mask(texts, pa.array(changed), pa.array([new_texts[i] for i in sorted(new_texts)], pa.string()))
        out_df["text"] = pd.arrays.ArrowExtensionArray(column)
    removed_rows = df[drop].copy()
    if drop.any():
        removed_rows["text"] = [audit[i] for i in np.flatnonzero(drop).tolist()]
    removed = removed_frame(removed_rows, "pii", pd.Series(drop_score[drop].astype(float)), np.nan,
                            text_chars=audit_text_chars)
    stats: dict[str, Any] = {
        "docs_in": len(df),
        "docs_out": int(len(df) - drop.sum()),
        "removed": {"pii": int(drop.sum())} if drop.any() else {},
        "docs_changed": len(new_texts),
        "docs_scanned": int(len(hit_rows)),
        "pii_matches": found,
        "pii_docs": docs,
        "pii_examples": shown,
    }
    return BatchResult(kept=out_df[~drop].reset_index(drop=True), removed=removed, stats=stats)
