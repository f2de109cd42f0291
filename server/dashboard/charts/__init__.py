"""The data of the dashboard's interactive charts, one module per family of charts; service.py
answers a chart by its kind."""
