"""The control API's routes, one ``APIRouter`` per resource (the module names it); ``routes.create_app`` includes
them all and ``routes.route_table`` lists their routes."""
