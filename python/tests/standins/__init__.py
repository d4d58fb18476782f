"""Stand-ins of the trainers' call sequences and types, written from their
source (each module names the file and commit). The trainers cannot be
installed here; these reproduce what the trainer does with the adapter's
answer, so a mismatch fails the way the real trainer would."""
