"""The commerce database's schema (contract §4): the public Olist Brazilian e-commerce dataset's
tables and columns, their misspellings included ("lenght"), and the `orders_enriched` view.

One home for these names: the SQL reward links answers against them, the SQL prompt shows them
to the model, and the demo bootstrap creates its synthetic database from `SCHEMA_SQL`.
"""
from __future__ import annotations

# table -> ((column, SQLite type and constraints), ...), then the table's primary key
_TABLES: dict[str, tuple[tuple[tuple[str, str], ...], tuple[str, ...]]] = {
    "olist_orders_dataset": ((
        ("order_id", "TEXT"), ("customer_id", "TEXT NOT NULL"), ("order_status", "TEXT NOT NULL"),
        ("order_purchase_timestamp", "TEXT"), ("order_approved_at", "TEXT"), ("order_delivered_carrier_date", "TEXT"),
        ("order_delivered_customer_date", "TEXT"), ("order_estimated_delivery_date", "TEXT"),
    ), ("order_id",)),
    "olist_order_items_dataset": ((
        ("order_id", "TEXT NOT NULL"), ("order_item_id", "INTEGER NOT NULL"), ("product_id", "TEXT"),
        ("seller_id", "TEXT"), ("shipping_limit_date", "TEXT"), ("price", "REAL"), ("freight_value", "REAL"),
    ), ("order_id", "order_item_id")),
    "olist_order_payments_dataset": ((
        ("order_id", "TEXT NOT NULL"), ("payment_sequential", "INTEGER NOT NULL"), ("payment_type", "TEXT"),
        ("payment_installments", "INTEGER"), ("payment_value", "REAL"),
    ), ("order_id", "payment_sequential")),
    "olist_order_reviews_dataset": ((
        ("review_id", "TEXT"), ("order_id", "TEXT NOT NULL"), ("review_score", "INTEGER"),
        ("review_comment_title", "TEXT"), ("review_comment_message", "TEXT"), ("review_creation_date", "TEXT"),
        ("review_answer_timestamp", "TEXT"),
    ), ("review_id",)),
    "olist_customers_dataset": ((
        ("customer_id", "TEXT"), ("customer_unique_id", "TEXT NOT NULL"), ("customer_zip_code_prefix", "TEXT"),
        ("customer_city", "TEXT"), ("customer_state", "TEXT"),
    ), ("customer_id",)),
    "olist_sellers_dataset": ((
        ("seller_id", "TEXT"), ("seller_zip_code_prefix", "TEXT"), ("seller_city", "TEXT"), ("seller_state", "TEXT"),
    ), ("seller_id",)),
    "olist_products_dataset": ((
        ("product_id", "TEXT"), ("product_category_name", "TEXT"), ("product_name_lenght", "INTEGER"),
        ("product_description_lenght", "INTEGER"), ("product_photos_qty", "INTEGER"), ("product_weight_g", "INTEGER"),
        ("product_length_cm", "INTEGER"), ("product_height_cm", "INTEGER"), ("product_width_cm", "INTEGER"),
    ), ("product_id",)),
    "product_category_name_translation": ((
        ("product_category_name", "TEXT"), ("product_category_name_english", "TEXT"),
    ), ("product_category_name",)),
}
TABLES: dict[str, tuple[str, ...]] = {table: tuple(name for name, _ in columns) for table, (columns, _) in _TABLES.items()}

INDEXES = (
    ("idx_items_order", "olist_order_items_dataset", "order_id"),
    ("idx_payments_order", "olist_order_payments_dataset", "order_id"),
    ("idx_reviews_order", "olist_order_reviews_dataset", "order_id"),
    ("idx_orders_customer", "olist_orders_dataset", "customer_id"),
    ("idx_orders_status", "olist_orders_dataset", "order_status"),
    ("idx_orders_purchase", "olist_orders_dataset", "order_purchase_timestamp"),
    ("idx_items_product", "olist_order_items_dataset", "product_id"),
    ("idx_items_seller", "olist_order_items_dataset", "seller_id"),
    ("idx_products_category", "olist_products_dataset", "product_category_name"),
    ("idx_customers_state", "olist_customers_dataset", "customer_state"),
    ("idx_payments_type", "olist_order_payments_dataset", "payment_type"),
)

VIEW = "orders_enriched"
VIEW_COLUMNS = (
    "order_id", "customer_id", "customer_unique_id", "customer_city", "customer_state", "order_status",
    "order_purchase_timestamp", "order_approved_at", "order_delivered_customer_date",
    "order_estimated_delivery_date", "order_item_id", "product_id", "seller_id", "price", "freight_value",
    "product_category_name", "product_category_name_english", "payment_type", "payment_installments",
    "payment_value", "review_score",
)
# One row per order item; an order's payments and reviews aggregated into it. Correlated subqueries
# on the order's id (indexed) read only the orders a query keeps: the earlier LEFT JOINs on
# grouped subqueries made SQLite aggregate both tables whole and build a throwaway index on them
# for every query on the view, 50-80 ms on the 6,000-order demo DB, even for one category's rows.
_VIEW_SQL = f"""CREATE VIEW {VIEW} AS
SELECT o.order_id, o.customer_id, c.customer_unique_id, c.customer_city, c.customer_state,
       o.order_status, o.order_purchase_timestamp, o.order_approved_at,
       o.order_delivered_customer_date, o.order_estimated_delivery_date,
       i.order_item_id, i.product_id, i.seller_id, i.price, i.freight_value,
       p.product_category_name, t.product_category_name_english,
       (SELECT MIN(payment_type) FROM olist_order_payments_dataset WHERE order_id = o.order_id) AS payment_type,
       (SELECT MAX(payment_installments) FROM olist_order_payments_dataset WHERE order_id = o.order_id) AS payment_installments,
       (SELECT SUM(payment_value) FROM olist_order_payments_dataset WHERE order_id = o.order_id) AS payment_value,
       (SELECT MAX(review_score) FROM olist_order_reviews_dataset WHERE order_id = o.order_id) AS review_score
FROM olist_orders_dataset o
JOIN olist_order_items_dataset i ON i.order_id = o.order_id
LEFT JOIN olist_products_dataset p ON p.product_id = i.product_id
LEFT JOIN product_category_name_translation t ON t.product_category_name = p.product_category_name
LEFT JOIN olist_customers_dataset c ON c.customer_id = o.customer_id;
"""


def _create_table(table: str) -> str:
    columns, key = _TABLES[table]
    body = [f"{name} {kind}" for name, kind in columns] + [f"PRIMARY KEY ({', '.join(key)})"]
    return f"CREATE TABLE {table} (\n    " + ",\n    ".join(body) + ");"


SCHEMA_SQL = "\n".join(
    [_create_table(table) for table in _TABLES]
    + [f"CREATE INDEX {name} ON {table}({column});" for name, table, column in INDEXES]
    + [_VIEW_SQL]
)
SCHEMA_COLUMNS: dict[str, tuple[str, ...]] = {**TABLES, VIEW: VIEW_COLUMNS}

# the domains of the columns a question names by value (contract §4)
UF_CODES = frozenset("AC AL AP AM BA CE DF ES GO MA MT MS MG PA PB PR PE PI RJ RN RS RO RR SC SP SE TO".split())
ORDER_STATUSES = ("delivered", "shipped", "canceled", "unavailable", "invoiced", "processing", "created", "approved")
PAYMENT_TYPES = ("credit_card", "boleto", "voucher", "debit_card", "not_defined")
