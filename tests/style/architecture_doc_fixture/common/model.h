// The model: named in the document.
