-- Weights set for fairness keys (see `store::fairness`): a submit places a row
-- of a key listed here with the key's weight instead of the row's own. Read by
-- primary key for each row of a fairness key a submit places (twice when the
-- key's chain exists: the upsert's update computes the stride again).
CREATE TABLE fairness_weights (
    namespace     TEXT    NOT NULL,
    activity_type TEXT    NOT NULL,
    fairness_key  TEXT    NOT NULL,
    weight        INTEGER NOT NULL CHECK (weight BETWEEN 1 AND 1000),
    PRIMARY KEY (namespace, activity_type, fairness_key)
);
