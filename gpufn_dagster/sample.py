"""Deterministic sample documents for the example pipeline and the `gpufn append-docs` command."""

from __future__ import annotations

import datetime
import random

import pyarrow as pa

_TOPICS = {
    "en": ("gpu", "lance", "dagster", "kubernetes", "embedding", "column", "refresh", "scheduler", "node", "pool"),
    "fr": ("calcul", "tableau", "colonne", "noeud", "grappe", "modèle", "donnée", "vecteur", "requête", "flux"),
}
_VERBS = {"en": ("computes", "fills", "schedules", "waits for", "refreshes", "stores"),
          "fr": ("calcule", "remplit", "planifie", "attend", "rafraîchit", "stocke")}

DOCS_SCHEMA = pa.schema([("id", pa.int64()), ("lang", pa.string()), ("text", pa.string()), ("day", pa.date32())])
FIRST_DAY = datetime.date(2026, 11, 1)  # the day of document 0: the example's daily partitions start here
DOCS_PER_DAY = 100


def sample_docs(rows: int, *, start_id: int = 0, seed: int = 7) -> pa.Table:
    """`rows` short documents in English and French with ids from `start_id`; document `i` is of day
    `FIRST_DAY + i // DOCS_PER_DAY` (the partition column of the README's daily partitions).

    >>> sample_docs(2, start_id=199).column("day").to_pylist()
    [datetime.date(2026, 11, 2), datetime.date(2026, 11, 3)]
    """
    rng = random.Random(seed + start_id)
    ids, langs, texts = [], [], []
    for i in range(start_id, start_id + rows):
        lang = "en" if rng.random() < 0.7 else "fr"
        words = _TOPICS[lang]
        sentence = " ".join([rng.choice(words).capitalize(), rng.choice(_VERBS[lang]),
                             *rng.sample(words, k=rng.randint(2, 6))])
        ids.append(i)
        langs.append(lang)
        texts.append(sentence + ".")
    days = [FIRST_DAY + datetime.timedelta(days=i // DOCS_PER_DAY) for i in ids]
    return pa.table({"id": ids, "lang": langs, "text": texts, "day": days}, schema=DOCS_SCHEMA)
