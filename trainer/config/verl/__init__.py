"""verl's config keys: which carry over, which are refused or warned, and how verl layouts map onto
ours."""
