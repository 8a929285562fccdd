"""Deterministic sample documents for the example pipeline and the `gpufn append-docs` command."""

from __future__ import annotations

import random

import pyarrow as pa

_TOPICS = {
    "en": ("gpu", "lance", "dagster", "kubernetes", "embedding", "column", "refresh", "scheduler", "node", "pool"),
    "fr": ("calcul", "tableau", "colonne", "noeud", "grappe", "modèle", "donnée", "vecteur", "requête", "flux"),
}
_VERBS = {"en": ("computes", "fills", "schedules", "waits for", "refreshes", "stores"),
          "fr": ("calcule", "remplit", "planifie", "attend", "rafraîchit", "stocke")}

DOCS_SCHEMA = pa.schema([("id", pa.int64()), ("lang", pa.string()), ("text", pa.string())])


def sample_docs(rows: int, *, start_id: int = 0, seed: int = 7) -> pa.Table:
    """`rows` short documents in English and French with ids from `start_id`."""
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
    return pa.table({"id": ids, "lang": langs, "text": texts}, schema=DOCS_SCHEMA)
