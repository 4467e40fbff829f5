"""`spade report`: one self-contained HTML page of what a run made (data, figures, page)."""
