"""Scoring a draft on the dumps: TTT accuracies as counts, the paired statistics, the chance level, the
sequential stopping rule, the slot statistics, and the exact merge of a torchrun's ranks."""
