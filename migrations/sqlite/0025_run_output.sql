-- A run's whole output (issue 48), redacted, in the order it came: chunks
-- of complete lines, `seq` counting a run's chunks from 1, `at` when the
-- chunk was written (ms). At most 4 MiB a run; the last chunk of a run cut
-- there says so. A streak of no_change runs keeps its newest run's output
-- under the streak's row; pruned with the history.
CREATE TABLE run_output (
    run_id INTEGER NOT NULL,
    seq    INTEGER NOT NULL,
    at     INTEGER NOT NULL,
    data   TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
) STRICT;
CREATE INDEX run_output_at ON run_output (at);
