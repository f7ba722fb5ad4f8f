-- A change of the priority aging ranks the waiting rows again in steps, in the
-- background: rows with ids in (rerank_after, rerank_to] may still carry the
-- ranking of the setting before; the pass is done when rerank_after reaches
-- rerank_to.
ALTER TABLE dispatch_settings
    ADD COLUMN rerank_after BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN rerank_to BIGINT NOT NULL DEFAULT 0;
