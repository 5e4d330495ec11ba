"""Deduplication, one file per phase: exact (hash, group, remove) and near (MinHash edges, SimHash
edges, clustering, removal), wired by `exact.ExactDedupStep` and `near.NearDedupStep`. Every phase
that removes documents writes the same removed rows (`stages.base.REMOVED_SCHEMA`)."""
