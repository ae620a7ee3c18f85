"""Planning: analyse a MatchSpec against its input schema and produce an executable Plan."""
