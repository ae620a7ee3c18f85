"""Parsing: locate MATCH_RECOGNIZE clauses in SQL and parse their bodies into MatchSpec."""
