-- A model's task instructions are part of its identity (DESIGN 12): the text put before every query and
-- every stored text it embeds (nomic-embed-text: 'search_query: ' / 'search_document: '). A vector
-- table holds vectors made with these and no others; other instructions are another model, reached
-- through `memctl reembed`. Models registered before this migration embedded text as it was: ''.
ALTER TABLE embedding_models
    ADD COLUMN query_prefix text NOT NULL DEFAULT '',
    ADD COLUMN document_prefix text NOT NULL DEFAULT '';
