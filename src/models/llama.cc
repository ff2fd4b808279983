// placeholder: the example model builders live here
