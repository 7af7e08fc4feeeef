//! Being written (issue 9).
