def inner():
    raise ValueError("the user's own error")


inner()
