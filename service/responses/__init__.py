"""Stored responses of the Responses API: the rules, the paging and the store."""
