-- Worker sessions' resume tickets, where every node sharing the database can check
-- them: a worker whose node died, or whose connection a balancer moved, resumes its
-- session on another node, which takes its RUNNING rows over (worker_node) in the
-- same transaction that replaces the ticket, so a ticket is used once across all
-- nodes. `registration` is the session's namespace, types and slots: a resume must
-- present the same.
CREATE TABLE worker_sessions (
    worker_id    TEXT   PRIMARY KEY,
    ticket       TEXT   NOT NULL,
    caller       TEXT   NOT NULL,
    registration TEXT   NOT NULL,
    updated_at   BIGINT NOT NULL
);

CREATE INDEX worker_sessions_updated ON worker_sessions (updated_at);
