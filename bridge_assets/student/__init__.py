"""The student stage: a calibrated cross-encoder learned from the verified labels (DIRAS's
student annotator), scoring every candidate-pool pair."""
