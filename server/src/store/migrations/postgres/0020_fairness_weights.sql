-- Weights set for fairness keys (see `store::fairness`): a submit places a row
-- of a key listed here with the key's weight instead of the row's own. Read by
-- primary key, once per row of a fairness key a submit places, in the submit's
-- own statement.
-- Nodes of the version before this one do not read it: while they run, rows they
-- accept are placed with their own weights.
CREATE TABLE fairness_weights (
    namespace     TEXT   NOT NULL,
    activity_type TEXT   NOT NULL,
    fairness_key  TEXT   NOT NULL,
    weight        BIGINT NOT NULL CHECK (weight BETWEEN 1 AND 1000),
    PRIMARY KEY (namespace, activity_type, fairness_key)
);
